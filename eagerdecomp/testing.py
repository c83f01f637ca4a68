"""Helpers for testing backends and eagerdecomp itself.

:class:`RecordingMode` is an independent witness: entered *outside*
:class:`~eagerdecomp.EagerDecompMode`, it sees exactly the ops that reach the
kernels below the mode, and :meth:`RecordingMode.assert_only` checks they are
all in the opset.

Example::

    >>> import torch, eagerdecomp as ed
    >>> from eagerdecomp.testing import RecordingMode
    >>> with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
    ...     _ = torch.nn.functional.silu(torch.randn(3))
    >>> rec.assert_only("core_aten")

:class:`KernelWitness` sees the same from a C++ dispatch key below the mode, so the mode
keeps its C++ key path (a Python mode outside makes it take its Python path).
"""

from __future__ import annotations

from eagerdecomp.runtime.recording import KernelWitness, RecordingMode, witness_available

__all__ = ["RecordingMode", "KernelWitness", "witness_available", "reference_device", "prims_reference_device"]


def reference_device():
    """The strict core-only reference device (``edref``); see :mod:`eagerdecomp.device.refdev`."""
    from eagerdecomp.device.refdev import reference_device as load

    return load()


def prims_reference_device():
    """The strict prims reference device (``edprims``, kernels for the ``prims_fusion`` preset);
    see :mod:`eagerdecomp.device.refdev`. One reference device per process: not in a process
    that registered ``edref``."""
    from eagerdecomp.device.refdev import PRIMS_DEVICE_NAME
    from eagerdecomp.device.refdev import reference_device as load

    return load(PRIMS_DEVICE_NAME)
