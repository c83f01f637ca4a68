"""``scatter_reduce`` and ``masked_scatter`` for opsets without them (``prims``, ``prims_fusion``).

Core ATen keeps both, so these entries only serve opsets that drop them: there ``index_reduce``,
scatter's ``reduce=`` forms and eagerdecomp's own writes into a tensor that overlaps itself
(``ops/overlap.py``) all lower through ``scatter_reduce.two``. Written with the preset's library
ops (``scatter_add``, ``scatter.src``/``value``, ``gather``, ``sort``) and pointwise ops.

``scatter_reduce`` follows eager's CPU kernel (TensorAdvancedIndexing.cpp): with
``include_self=False`` the indexed positions are first set to the reduction's identity; each
position then folds in, in index order, the source elements whose index names it; ``mean``
divides the sum by the count of what was folded (self counted when included; floor division
for integers). sum and mean are ``scatter_add`` itself. prod, amax and amin reduce each
position's group side by side: the index is sorted along ``dim`` (key ``index * n + i``: unique,
so the order is the index order whatever the sort's stability), each group's elements combined
by a segmented scan in ``log2(n)`` steps, and the group's first element writes the total, the
others a spare row cut off afterwards. amax/amin combine as the kernel's fold does (a NaN wins
and stays, ties keep the earlier value: signed zeros too), which makes any grouping give the
fold's answer; integer products wrap the same whatever the grouping. A float product depends on
the order of its roundings: up to :data:`_IN_ORDER_MAX` index entries along ``dim`` it is folded
one entry at a time, in the kernel's order (exact); past that the scan's grouping rounds
otherwise (within the dtype's tolerance). Up to :data:`_IN_ORDER_FEW` entries every reduction
takes that one-entry-at-a-time path: fewer ops than the scan.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.checks import scalar_type_name

aten = torch.ops.aten

# Up to this many index entries along dim a reduction is folded one entry at a time, in eager's
# order (exact, and fewer ops than the grouped scan for few entries); a float product, whose
# rounding depends on that order, up to _IN_ORDER_MAX.
_IN_ORDER_FEW = 16
_IN_ORDER_MAX = 64


def _max_fold(acc, x):
    # eager's fold: `isnan(x) ? x : std::max(acc, x)`, std::max keeping acc unless acc < x
    return aten.where.self(aten.logical_or.default(aten.isnan.default(x), aten.lt.Tensor(acc, x)), x, acc)


def _min_fold(acc, x):
    return aten.where.self(aten.logical_or.default(aten.isnan.default(x), aten.lt.Tensor(x, acc)), x, acc)


def _prod_fold(acc, x):
    return aten.mul.Tensor(acc, x)


_FOLDS = {"prod": _prod_fold, "amax": _max_fold, "amin": _min_fold}
_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _identity(reduce, dtype):
    """The value eager's kernel sets indexed positions to when self is not included."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype == torch.bool:
        return reduce == "amin"
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _ahead(t, dim, s):
    """``t`` shifted s places back along dim (element p holds p + s; the tail wraps around)."""
    n = t.shape[dim]
    return aten.cat.default([aten.slice.Tensor(t, dim, s, n), aten.slice.Tensor(t, dim, 0, s)], dim)


def _positions(index, dim, device):
    """0..n-1 along dim, shaped to broadcast against index."""
    shape = [1] * index.dim()
    shape[dim] = index.shape[dim]
    return aten.view.default(aten.arange.start_step(0, index.shape[dim], 1, dtype=torch.int64, device=device), shape)


def _in_order(out, dim, index, src, fold):
    """One index entry along dim at a time: each step's entries name distinct positions."""
    for d, n in enumerate(index.shape):
        if d != dim and src.shape[d] != n:
            src = aten.slice.Tensor(src, d, 0, n)
    for i in range(index.shape[dim]):
        at = aten.slice.Tensor(index, dim, i, i + 1)
        step = fold(aten.gather.default(out, dim, at), aten.slice.Tensor(src, dim, i, i + 1))
        out = aten.scatter.src(out, dim, at, step)
    return out


def _grouped(self, dim, index, src, fold, include_self):
    """Every position's group folded side by side (see the module docstring)."""
    n = index.shape[dim]
    pos = _positions(index, dim, index.device)
    self_at = aten.gather.default(self, dim, index)  # (also eager's out-of-bounds check of index)
    _, perm = aten.sort.default(aten.add.Tensor(aten.mul.Scalar(index, n), pos), dim)
    tgt = aten.gather.default(index, dim, perm)
    value = aten.gather.default(src, dim, perm)
    self_at = aten.gather.default(self_at, dim, perm)
    s = 1
    while s < n:  # value[p] folds in p..min(p + 2s - 1, the group's end)
        same = aten.logical_and.default(aten.eq.Tensor(tgt, _ahead(tgt, dim, s)), aten.lt.Scalar(pos, n - s))
        value = aten.where.self(same, fold(value, _ahead(value, dim, s)), value)
        s *= 2
    first = aten.logical_or.default(
        aten.eq.Scalar(pos, 0), aten.ne.Tensor(tgt, _ahead(tgt, dim, n - 1))
    )  # (n - 1 ahead: p - 1)
    total = fold(self_at, value) if include_self else value
    # the group's first element writes its total; the others write into a spare row cut off below
    size = self.shape[dim]
    spare = aten.cat.default([self, aten.slice.Tensor(self, dim, 0, 1)], dim)
    where = aten.where.self(first, tgt, aten.full_like.default(tgt, size))
    out = aten.scatter.src(spare, dim, where, aten.where.self(first, total, self_at))
    return aten.slice.Tensor(out, dim, 0, size)


def _check_shapes(self, dim, index, src):
    """eager's scatter_shape_check (ScatterGatherChecks.h), in its order and words: the steps
    below would otherwise fail on a sliced index, in other words."""
    if index.numel() == 0:
        return
    if index.dim() != self.dim():
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    d = dim % self.dim()
    wrong = any(n > self.shape[k] for k, n in enumerate(index.shape) if k != d)
    for k, n in enumerate(index.shape):
        if wrong:
            break
        if k >= src.dim():  # (eager reads src.size(k): its IndexError)
            m = src.dim()
            raise IndexError(f"Dimension out of range (expected to be in range of [{-m}, {m - 1}], but got {k})")
        wrong = n > src.shape[k]
    if wrong:
        raise RuntimeError(
            f"Expected index {list(index.shape)} to be no larger than self {list(self.shape)} apart from "
            f"dimension {d} and to be no larger size than src {list(src.shape)}"
        )


@project_decomposition(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if reduce not in _REDUCES:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if self.dim() and index.dim() and src.dim():
        _check_shapes(self, dim, index, src)
    if self.dim() == 0 or index.dim() == 0 or src.dim() == 0:
        # NOTE: eager reads a 0-dim tensor as a 1-element one here
        flat = [aten.view.default(t, [1]) if t.dim() == 0 else t for t in (self, index, src)]
        out = scatter_reduce(flat[0], dim, flat[1], flat[2], reduce, include_self=include_self)
        return aten.view.default(out, list(self.shape))
    dim = dim % self.dim()
    if index.numel() == 0:
        return aten.clone.default(self, memory_format=torch.contiguous_format)
    out = self
    if not include_self:
        out = aten.scatter.value(self, dim, index, _identity(reduce, self.dtype))
    if reduce in ("sum", "mean"):
        out = aten.scatter_add.default(out, dim, index, src)
        if reduce == "mean":
            count = aten.full_like.default(self, 1 if include_self else 0, memory_format=torch.contiguous_format)
            count = aten.scatter_add.default(count, dim, index, aten.ones_like.default(src))
            count = aten.masked_fill.Scalar(count, aten.eq.Scalar(count, 0), 1)
            integral = not (self.dtype.is_floating_point or self.dtype.is_complex)
            out = aten.div.Tensor_mode(out, count, rounding_mode="floor") if integral else aten.div.Tensor(out, count)
    elif index.shape[dim] <= (_IN_ORDER_MAX if reduce == "prod" and self.dtype.is_floating_point else _IN_ORDER_FEW):
        out = _in_order(out, dim, index, src, _FOLDS[reduce])
    else:
        out = _grouped(out, dim, index, src, _FOLDS[reduce], include_self)
    return aten.clone.default(out, memory_format=torch.contiguous_format)


def _count_upto(flat):
    """How many of ``flat``'s elements up to each one are set (an inclusive int64 cumsum).

    NOTE: not aten.cumsum: under a prims opset its ref sums a [n, n] masked matrix (300k mask
    elements asked for 90 GB). A scan in log2(n) shifted adds, exact in int64."""
    n = flat.shape[0]
    total = aten._to_copy.default(flat, dtype=torch.int64)
    s = 1
    while s < n:
        behind = aten.cat.default([aten.full.default([s], 0, dtype=torch.int64, device=flat.device), total])
        total = aten.add.Tensor(total, aten.slice.Tensor(behind, 0, 0, n))
        s *= 2
    return total


# NOTE: masked_scatter(self, mask, source) is eager's clone of self and mask broadcast together,
# its masked positions taking source's elements in row-major order: the k-th masked position
# takes source.flatten()[k], k counted by a scan of the mask, read with gather (which raises
# eager's kind of error, a RuntimeError, where source is too short).
@project_decomposition(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    if mask.dtype != torch.bool:
        raise RuntimeError(
            f"masked_scatter_ only supports boolean masks, but got mask with dtype {scalar_type_name(mask.dtype)}"
        )
    if self.dtype != source.dtype:
        raise RuntimeError(
            "masked_scatter: expected self and source to have same dtypes but got"
            f"{scalar_type_name(self.dtype)} and {scalar_type_name(source.dtype)}"  # (no space: eager's words)
        )
    shape = list(torch.broadcast_shapes(self.shape, mask.shape))
    base = aten.reshape.default(aten.expand.default(self, shape), [-1])
    flat = aten.reshape.default(aten.expand.default(mask, shape), [-1])
    if base.numel() == 0:
        return aten.clone.default(aten.expand.default(self, shape), memory_format=torch.contiguous_format)
    if source.numel() == 0:  # nothing to read: eager's check, on the mask's values
        if aten._local_scalar_dense.default(aten.any.default(flat)):
            raise RuntimeError("Number of elements of source < number of ones in mask")
        return aten.clone.default(aten.view.default(base, shape), memory_format=torch.contiguous_format)
    k = aten.sub.Scalar(_count_upto(flat), 1)
    taken = aten.gather.default(
        aten.reshape.default(source, [-1]), 0, aten.where.self(flat, k, aten.zeros_like.default(k))
    )
    return aten.view.default(aten.where.self(flat, taken, base), shape)
