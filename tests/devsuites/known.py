"""Tests of PyTorch's device suites expected to fail on edref, each with its reason.

A reason is an op with no path to edref's kernels or a device feature edref does
not offer; never a wrong result. ``KNOWN`` maps a generic test id (device written
``DEVICE``) to its reason.
"""

KNOWN: dict[str, str] = {}
