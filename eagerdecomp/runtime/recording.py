"""Witnesses: what reaches the kernels. Public in :mod:`eagerdecomp.testing`.

* :class:`RecordingMode` is a Python dispatch mode that counts the ops reaching it (the
  witness tests and the compiled-kernel check use it). Entered outside
  :class:`~eagerdecomp.EagerDecompMode`, it makes the mode take its Python path (a Python
  mode always sees ops before a C++ key), where it sees what the mode sends below.
* :class:`KernelWitness` counts the ops reaching a C++ dispatch key *below* the mode's
  (``csrc/mode.h``'s ``kWitnessKey``), so it sees what either of the mode's paths sends to the
  kernels, and leaves the mode on its C++ key.
"""

from __future__ import annotations

import threading
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime.routes import is_communication, is_infrastructure

__all__ = ["RecordingMode", "KernelWitness", "witness_available"]


class _Seen:
    """What a witness saw (``self.ops``: op -> calls), and the checks on it."""

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


class RecordingMode(_Seen, TorchDispatchMode):
    """Counts every op that reaches it, then runs it unchanged."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


_lock = threading.Lock()
_registered: list = []
_active: list = []  # the witness recording now (one at a time: its counts are process-wide)


def _library():
    from eagerdecomp.runtime.library import load

    lib = load()
    return lib if lib is not None and hasattr(lib, "mode") else None


def witness_available() -> bool:
    """Whether :class:`KernelWitness` can run here (the C++ library is loaded)."""
    return _library() is not None


def _composite_ops() -> list:
    """Ops with a CompositeExplicitAutograd[NonFunctional] kernel: registered for every backend
    key, the witness's included, so each gets the witness's kernel by name instead."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        try:
            if has(name, "CompositeExplicitAutograd") or has(name, "CompositeExplicitAutogradNonFunctional"):
                out.append(name)
        except RuntimeError:  # (a name torch lists with no dispatcher entry)
            continue
    return out


class KernelWitness(_Seen):
    """Counts the ops that reach the kernels below any mode, from a C++ dispatch key below the
    mode's; usable around or inside :class:`~eagerdecomp.EagerDecompMode` on either path.

    Sees what a kernel is called for, not what the kernel calls (it runs with the witness off).
    Blind, as any key below ``BackendSelect`` is: factory ops with no tensor argument whose
    kernel is chosen by ``BackendSelect`` (``empty.memory_format``, ``randn``...; the mode's C++
    key records those it passes through, see docs/internals.md), and ops on sparse, quantized
    and nested tensors (their keys outrank it). Fake and meta calls are
    not counted. One witness records at a time; it sees this thread and the threads autograd
    and ``at::launch`` run for it.
    """

    def __init__(self):
        self.ops: Counter = Counter()
        self._prev = []

    def __enter__(self):
        lib = _library()
        if lib is None:
            raise RuntimeError("KernelWitness needs eagerdecomp's C++ library (see python -m eagerdecomp.info)")
        with _lock:
            if not _registered:
                lib.mode.register_witness(_composite_ops())
                _registered.append(True)
            if _active:
                raise RuntimeError("a KernelWitness is already recording; one records at a time")
            _active.append(self)
            lib.mode.witness_clear()
        self._prev.append(lib.mode.witness_on(True))
        return self

    def __exit__(self, *exc):
        lib = _library()
        lib.mode.witness_on(self._prev.pop())
        with _lock:
            _active.remove(self)
            for name, n in lib.mode.witness_seen().items():
                self.ops[_op(name)] += n
        return None


def _op(name: str):
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
