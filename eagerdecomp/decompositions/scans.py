"""Cumulative sums and products (``cumsum``, ``cumprod``) as log-step scans.

Core ATen keeps both ops; a prims opset (``prims``, ``prims_fusion``) lowered them through
``torch._refs``, which masks an ``[n, n]`` copy of the input and reduces it: memory quadratic
in the scanned length (a 300,000-element cumsum asked for 90 GB). Here the scan takes
``ceil(log2 n)`` steps of one shifted add (or multiply) each (Hillis and Steele), memory linear.

NOTE: integers are exact (sums and products wrap modulo 2**64 in any order). Floats are summed
in another order than the CPU kernel's running total (as the ref's reduction did), so they agree
to rounding; 16-bit floats are scanned in float32 and rounded once, as the kernel accumulates.
"""

from __future__ import annotations

import torch
from torch._prims_common import canonicalize_dim, is_boolean_dtype, is_integer_dtype

from eagerdecomp.decompositions.numerics import cast, opmath
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

# op -> (the combining op, its identity)
_SCANS = {
    aten.cumsum.default: (aten.add.Tensor, 0),
    aten.cumprod.default: (aten.mul.Tensor, 1),
}


def _scan(combine, identity, self, dim, dtype):
    # eager's result type: the dtype asked for, else int64 for integers and bool, else the input's
    if dtype is None:
        dtype = torch.int64 if is_integer_dtype(self.dtype) or is_boolean_dtype(self.dtype) else self.dtype
    dim = canonicalize_dim(self.dim(), dim)  # (eager's IndexError for a dim out of range)
    # (eager's result is row-major whatever the input's layout, empty ones included)
    x = aten._to_copy.default(self, dtype=opmath(dtype), memory_format=torch.contiguous_format)
    n = x.shape[dim] if x.dim() else 1
    step = 1
    while step < n:
        # x[i] combines x[i - step] into itself: after the step with 2**k, x[i] covers 2**(k+1) inputs
        head = list(x.shape)
        head[dim] = step
        pad = aten.full.default(head, identity, dtype=x.dtype, device=x.device)
        shifted = aten.cat.default([pad, aten.slice.Tensor(x, dim, 0, n - step)], dim)
        x = combine(x, shifted)
        step *= 2
    return cast(x, dtype)


def _register(op, combine, identity):
    @project_decomposition(op)
    def scan(self, dim, *, dtype=None):
        return _scan(combine, identity, self, dim, dtype)

    scan.__name__ = scan.__qualname__ = op._opname
    return scan


for _op, (_combine, _identity) in _SCANS.items():
    _register(_op, _combine, _identity)
