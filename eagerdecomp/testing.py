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
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from .routes import is_communication, is_infrastructure
from .opset import OpSet

__all__ = ["RecordingMode", "reference_device"]


class RecordingMode(TorchDispatchMode):
    """Counts every op that reaches it, then runs it unchanged."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))

    def outside(self, opset) -> list:
        """Ops seen that are not in ``opset``; infrastructure (``prim::``, ``profiler::``) and
        collectives (``c10d::``, ``_c10d_functional::`` ...), which the process group's backend
        runs, excepted: see :data:`eagerdecomp.routes.NAMESPACES`."""
        opset = OpSet.coerce(opset)
        return sorted(
            str(op) for op in self.ops if op not in opset and not is_infrastructure(op) and not is_communication(op)
        )

    def collectives(self) -> list:
        """The collectives seen (they pass through the mode untouched)."""
        return sorted(str(op) for op in self.ops if is_communication(op))

    def assert_only(self, opset) -> None:
        bad = self.outside(opset)
        if bad:
            raise AssertionError(f"ops outside {OpSet.coerce(opset)!r} reached the kernels: {bad}")


def reference_device():
    """The strict core-only reference device (``edref``); see :mod:`eagerdecomp.refdev`."""
    from .refdev import reference_device as load

    return load()
