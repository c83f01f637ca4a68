"""Tests of PyTorch's device suites expected to fail on edref, each with its reason.

A reason is an op with no path to edref's kernels, a device feature edref does not
offer, or a test that assumes its device is CPU or CUDA; never a wrong result.
Entries are generic test ids (the device written ``DEVICE``); ``*`` matches any run of
characters, for a test's parametrized copies.
"""

from __future__ import annotations

import fnmatch
import functools

_BY_REASON: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple:
    return tuple((p, reason) for reason, ids in _BY_REASON.items() for p in ids.split())


def reason_for(test_id: str) -> str | None:
    """Why ``test_id`` is expected to fail on edref, or None."""
    for pattern, reason in _patterns():
        if fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


def unused(test_ids) -> list:
    """Patterns that match none of ``test_ids`` (stale entries, in a run of every test)."""
    ids = list(test_ids)
    return [p for p, _ in _patterns() if not any(fnmatch.fnmatchcase(t, p) for t in ids)]
