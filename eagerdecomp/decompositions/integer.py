"""Integer arithmetic with no path to core ATen in PyTorch's tables."""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

# Euclid's algorithm takes at most k steps when both operands are below the k-th Fibonacci number
_EUCLID_STEPS = {torch.uint8: 14, torch.int8: 13, torch.int16: 25, torch.int32: 47, torch.int64: 93}


# NOTE: gcd (and lcm, which PyTorch composes from it) has no decomposition. The kernel runs
# Euclid on |a|, |b| until a is 0; here every element takes the dtype's worst-case number of
# steps, masked once it has finished (no data value read, so it traces once). Exact.
@project_decomposition(aten.gcd.default)
def gcd(self, other):
    dtype = torch.result_type(self, other)
    if dtype not in _EUCLID_STEPS:
        return NotImplemented
    shape = list(torch.broadcast_shapes(self.shape, other.shape))
    a = aten.abs.default(aten.expand.default(aten._to_copy.default(self, dtype=dtype), shape))
    b = aten.abs.default(aten.expand.default(aten._to_copy.default(other, dtype=dtype), shape))
    zero = aten.zeros_like.default(a)
    one = aten.ones_like.default(a)
    for _ in range(_EUCLID_STEPS[dtype]):
        running = aten.ne.Scalar(a, 0)
        c = a
        a = aten.where.self(running, aten.remainder.Tensor(b, aten.where.self(running, a, one)), zero)
        b = aten.where.self(running, c, b)
    return aten.clone.default(b, memory_format=torch.contiguous_format)
