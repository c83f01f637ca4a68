"""Forward-mode AD below the autograd layer.

Forward AD (``torch.autograd.forward_ad``, ``torch.func.jvp``) computes tangents in
the autograd kernels, above eagerdecomp: the mode and the device fallback only see
the primal computation, with the autograd keys excluded. But while a dual level is
open, printing any tensor asks autograd for its primal (``Tensor.__repr__`` calls
``unpack_dual``), and below autograd that reaches ``_fw_primal``'s stub, which
PyTorch asserts is never called. Decompositions print tensors without meaning to:
calling an op packet (``aten.__and__(a, b)``) with arguments that do not fit its
first overload formats them into the overload-resolution message.

:func:`primal_level` hides the open level from Python while decompositions run, so
``unpack_dual`` answers "no tangent" as it does outside any level; no tangent is
computed down here either way.

Example::

    >>> import torch, eagerdecomp as ed
    >>> import torch.autograd.forward_ad as fwAD
    >>> p, t = torch.randn(3), torch.randn(3)
    >>> with ed.EagerDecompMode("core_aten"), fwAD.dual_level():
    ...     torch.allclose(fwAD.make_dual(p, t), p)    # decomposed: isclose, all
    True
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch.autograd.forward_ad as _fwad

__all__ = ["primal_level", "level_open", "below_forward_ad"]

_lock = threading.Lock()
_hidden = {"depth": 0, "level": -1}  # open hiders (all threads), and the level they hid


def level_open() -> bool:
    """True while a dual level is open (or hidden by a running :func:`primal_level`)."""
    return _fwad._current_level >= 0 or _hidden["depth"] > 0


@contextlib.contextmanager
def primal_level():
    """Hide the open dual level from Python for the block.

    NOTE: PyTorch keeps the level in a module global, not per thread (it supports one
    level per process), so a hider in one thread hides it for all: the last one out puts
    it back, and another thread's ``make_dual`` in the meantime would be refused.
    """
    with _lock:
        if _hidden["depth"] == 0:
            _hidden["level"], _fwad._current_level = _fwad._current_level, -1
        _hidden["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _hidden["depth"] -= 1
            if _hidden["depth"] == 0:
                _fwad._current_level = _hidden["level"]


def below_forward_ad(fn):
    """Run ``fn`` (a path that runs decompositions in Python) under :func:`primal_level`
    when a dual level is open; otherwise call it directly (one global read)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not level_open():
            return fn(*args, **kwargs)
        with primal_level():
            return fn(*args, **kwargs)

    return wrapper
