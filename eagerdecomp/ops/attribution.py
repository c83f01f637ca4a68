"""Eager's warnings, attributed as eager attributes them.

Eager raises a kernel's warnings (``TORCH_WARN``) when the op returns to Python, at the frame
that called the op: the user's line, or the line of torch's Python code that called it. A
warning eagerdecomp raises on eager's behalf (a replayed kernel's, an ``out=`` resized by a
decomposition) comes from deep inside the runtime; :func:`warn_as_eager` gives it the frame
eager would. Python's "default" filter shows a warning once per file and line, so a wrong
line is more than cosmetic: it showed one warning for all of a program's call sites.

Example::

    >>> import os, warnings, torch, eagerdecomp as ed
    >>> with warnings.catch_warnings(record=True) as w, ed.EagerDecompMode("core_aten"):
    ...     warnings.simplefilter("always")
    ...     _ = torch.special.expit(torch.randn(4), out=torch.empty(2))   # resized: eager warns
    >>> package = os.path.dirname(ed.__file__)
    >>> w[0].category.__name__, w[0].filename.startswith(package)   # this line's, as eager's
    ('UserWarning', False)
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["entry", "warn_as_eager"]

_ENTRIES: set = set()  # the code of the functions where a call enters eagerdecomp from the dispatcher
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KERNELS = "<eagerdecomp kernel"  # the file name of traced kernels' code (trace.py)


def entry(fn):
    """Mark ``fn`` as the runtime's entry from the dispatcher (the mode's and the switch's)."""
    _ENTRIES.add(fn.__code__)
    return fn


def _ours(frame) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_PACKAGE) or name.startswith(_KERNELS)


def warn_as_eager(message: str, category=UserWarning) -> None:
    """Raise one of eager's warnings for the op being called, attributed as eager attributes it.

    NOTE: eager raises a kernel's warnings (TORCH_WARN) when the op returns to Python, at the
    frame that called the op. Raised from inside eagerdecomp, a warning would name one of our
    lines instead (the ``stacklevel`` of whatever frame happened to raise it), and Python's
    "default" filter, which shows a warning once per file and line, would then show it once for
    all of a program's call sites. The frame that called the op is the first outside
    eagerdecomp beyond the outermost entry (a decomposition's ops may enter again, from inside).
    """
    frames = []
    f = sys._getframe(1)
    while f is not None:
        frames.append(f)
        f = f.f_back
    start = 0
    for i, f in enumerate(frames):
        if f.f_code in _ENTRIES:
            start = i + 1
    level = start
    while level < len(frames) and _ours(frames[level]):
        level += 1
    if level == len(frames):  # (no frame outside eagerdecomp: a call from our own code)
        level = 0
    warnings.warn(message, category, stacklevel=level + 2)
