"""RecordingMode: a dispatch mode that counts the ops reaching it (the witness tests and the
compiled-kernel check use). Public as :class:`eagerdecomp.testing.RecordingMode`."""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime.routes import is_communication, is_infrastructure

__all__ = ["RecordingMode"]


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
        runs, excepted: see :data:`eagerdecomp.runtime.routes.NAMESPACES`."""
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
