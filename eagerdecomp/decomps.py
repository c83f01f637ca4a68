"""eagerdecomp's own decompositions: ops PyTorch leaves without one, or decomposes wrongly.

Each entry says why it exists. They are registered at import and take
precedence over ``torch._decomp``'s tables (user registrations win over them).
"""

from __future__ import annotations

import torch

from .table import project_decomposition

aten = torch.ops.aten


@project_decomposition(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    # empty_like's only path; the strides of a tensor laid out in `physical_layout` order
    strides = [0] * len(size)
    step = 1
    for dim in reversed(physical_layout):
        strides[dim] = step
        step *= max(size[dim], 1)
    return aten.empty_strided.default(size, strides, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)


@project_decomposition(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator=None):
    # NOTE: no decomposition in PyTorch (dropout's training path needs it). It draws one
    # uniform per element from the global generator, as the CPU kernel does, but the
    # streams are not bit-identical to the native kernel's.
    if generator is not None:
        return NotImplemented
    u = aten.rand.default(self.shape, dtype=self.dtype if self.dtype.is_floating_point else torch.float32, device=self.device)
    return aten._to_copy.default(aten.lt.Scalar(u, p), dtype=self.dtype)


def _where_scalars(cond, a, b):
    dtype = torch.result_type(a, b)
    device = cond.device

    def as_tensor(v):
        if isinstance(v, torch.Tensor):
            return v if v.dtype == dtype else aten._to_copy.default(v, dtype=dtype)
        return aten.scalar_tensor.default(v, dtype=dtype, device=device)

    return aten.where.self(cond, as_tensor(a), as_tensor(b))


# NOTE: PyTorch's refs lower these through prims.where, whose aten implementation
# calls the same overload again: a cycle. A 0-dim tensor of the promoted dtype is exact.
@project_decomposition(aten.where.ScalarOther)
def where_scalar_other(condition, self, other):
    return _where_scalars(condition, self, other)


@project_decomposition(aten.where.ScalarSelf)
def where_scalar_self(condition, self, other):
    return _where_scalars(condition, self, other)


@project_decomposition(aten.where.Scalar)
def where_scalar(condition, self, other):
    return _where_scalars(condition, self, other)
