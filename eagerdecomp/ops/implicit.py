"""What a CompositeImplicitAutograd op is implemented by: the ops its composite kernel calls.

Such an op (``linalg_eigh``, ``svd``, ``grid_sample``...) never reaches a backend: its
composite kernel runs above every backend key, and the backend (a device's kernels, the
switch's fallback, the CPU tier) meets the ops that kernel calls (``_linalg_eigh``). A name
a user gives for it (``EAGERDECOMP_CPU_FALLBACK_DENY=linalg_eigh``) must therefore reach
those ops. The kernel is C++ and what it calls depends on its arguments, so the only way
to learn it is to run it: :func:`implemented_by` runs PyTorch's own OpInfo samples of the
op (small CPU tensors, no gradient) under a dispatch mode, which sits below the composite
and so records each op it calls. Several samples are run and their calls united, since a
composite may branch on its arguments.

Example::

    >>> import torch
    >>> from eagerdecomp.ops.implicit import implemented_by, is_implicit
    >>> is_implicit(torch.ops.aten.linalg_eigh.default)
    True
    >>> torch.ops.aten._linalg_eigh.default in implemented_by(torch.ops.aten.linalg_eigh.default)
    True
"""

from __future__ import annotations

import functools
import itertools
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from eagerdecomp.ops.variants import functional_variant

__all__ = ["is_implicit", "implemented_by", "SAMPLES"]

SAMPLES = 4  # OpInfo samples run per op (per dtype tried)


def is_implicit(op) -> bool:
    """True when ``op`` has a CompositeImplicitAutograd kernel, so a backend never meets it."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


class _Record(TorchDispatchMode):
    """Records each op that reaches it (those the composite kernel above it called), then runs it."""

    def __init__(self, into: set):
        super().__init__()
        self.into = into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.into.add(func)
        return func(*args, **(kwargs or {}))


def _opinfos(base: str) -> list:
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # noqa: BLE001 - torch's testing modules need expecttest; without them there are no samples
        return []
    return [info for info in op_db if base in (info.aten_name, info.name.replace(".", "_"), info.name)]


@functools.cache
def implemented_by(op) -> frozenset | None:
    """The ops ``op``'s CompositeImplicitAutograd kernel calls on PyTorch's OpInfo samples of it
    (an in-place or out= op: its functional op's), or None when no sample could be run (no
    OpInfo for the op, or ``torch.testing`` unavailable)."""
    functional = functional_variant(op) or op
    base = functional._schema.name.partition("::")[2]
    called: set = set()
    ran = False
    # NOTE: the samples draw random numbers and must not move the caller's stream; their
    # warnings (deprecations of the op itself) are not the caller's either
    with _disable_current_modes(), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        for info in _opinfos(base):
            dtypes = info.supported_dtypes("cpu")
            for dtype in [d for d in (torch.float64, torch.float32, torch.int64, torch.bool) if d in dtypes][:1]:
                try:
                    samples = list(itertools.islice(info.sample_inputs("cpu", dtype), SAMPLES))
                except Exception:  # noqa: BLE001 - an OpInfo this torch cannot build proves nothing
                    continue
                for s in samples:
                    seen: set = set()
                    try:
                        with torch.no_grad(), _Record(seen):
                            functional(s.input, *s.args, **s.kwargs)
                    except Exception:  # noqa: BLE001 - a sample bound to another overload's schema
                        continue
                    called |= seen
                    ran = True
    return frozenset(called) if ran else None
