"""Order statistics in core ops: the maximum and minimum of all elements, cumulative extremes,
stable sort, logcumsumexp, searchsorted, bincount, and unique in all its forms (``_unique``,
``_unique2``, ``unique_consecutive``, ``unique_dim``). Histograms: histogram.py; median, mode
and kthvalue: selection.py.

Each decomposition follows its CPU kernel's arithmetic where the kernel defines the answer
(bin selection, tie-breaking); where an argument would need a rule the decomposition does
not reproduce, it declines (no path, a clear error) rather than answer differently.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


def _item(t):
    return aten._local_scalar_dense.default(t)


# NOTE: the full reductions x.max() / x.min() have no decomposition in PyTorch;
# amax/amin over every dimension are core and return the same 0-dim tensor.
@project_decomposition(aten.max.default)
def max_all(self):
    return aten.amax.default(self, list(range(self.dim())))


@project_decomposition(aten.min.default)
def min_all(self):
    return aten.amin.default(self, list(range(self.dim())))


# NOTE: histc moved to histogram.py (with histogram and histogramdd, which share its bin rules).


# NOTE: cummax/cummin have no decomposition in PyTorch. The CPU kernel walks the dim keeping
# (value, index) and takes element i when it is NaN or, the running value not being NaN, i's
# value is >= (cummin: <=) it: ties go to the latest index and a NaN sticks, with the index
# of the latest NaN. That update is associative, so a log-depth scan (Hillis-Steele:
# combine each position with the one 1, 2, 4, ... before it) computes it in core ops. Values
# are selected, never computed: exact.
def _cumulative_extreme(self, dim, better):
    if self.dim() == 0:
        return aten.clone.default(self), aten.full.default([], 0, dtype=torch.int64, device=self.device)
    dim = dim % self.dim()
    n = self.shape[dim]
    shape = [1] * self.dim()
    shape[dim] = n
    pos = aten.view.default(aten.arange.default(n, device=self.device), shape)
    values, index = aten.clone.default(self), aten.expand.default(pos, list(self.shape))
    k = 1
    while k < n:
        prev_v = aten.cat.default([aten.slice.Tensor(values, dim, 0, k), aten.slice.Tensor(values, dim, 0, n - k)], dim)
        prev_i = aten.cat.default([aten.slice.Tensor(index, dim, 0, k), aten.slice.Tensor(index, dim, 0, n - k)], dim)
        take = aten.logical_or.default(
            aten.lt.Scalar(pos, k),  # nothing k before: keep
            aten.logical_or.default(
                aten.isnan.default(values),
                aten.logical_and.default(aten.logical_not.default(aten.isnan.default(prev_v)), better(values, prev_v)),
            ),
        )
        values = aten.where.self(take, values, prev_v)
        index = aten.where.self(take, index, prev_i)
        k *= 2
    if n <= 1:  # no step ran: index is still the broadcast arange; materialize it
        index = aten.clone.default(index, memory_format=torch.contiguous_format)
    return values, index


@project_decomposition(aten.cummax.default)
def cummax(self, dim):
    return _cumulative_extreme(self, dim, aten.ge.Tensor)


@project_decomposition(aten.cummin.default)
def cummin(self, dim):
    return _cumulative_extreme(self, dim, aten.le.Tensor)


# NOTE: a stable sort from core sort, which makes no stability promise. Pass one sorts the
# values (any order among equals); equal neighbours (NaNs equal to each other, -0.0 to 0.0:
# what the comparator treats as equal) then share a group number g, ascending in sorted
# order (a cumsum of "differs from the previous"). Pass two sorts the keys g * n + i, i the
# original index: the keys are distinct integers, so their order is unique whatever the
# algorithm, and it is by group, then by original index within a group. That is the
# definition of a stable sort; the values are gathered at the resulting indices. Exact.
@project_decomposition(aten.sort.stable)
def sort_stable(self, *, stable=None, dim=-1, descending=False):
    if not stable:
        return aten.sort.default(self, dim, descending)
    if self.dim() == 0:
        return aten.clone.default(self), aten.full.default([], 0, dtype=torch.int64, device=self.device)
    dim = dim % self.dim()
    n = self.shape[dim]
    if n <= 1 or self.numel() == 0:
        return aten.sort.default(self, dim, descending)
    values, index = aten.sort.default(self, dim, descending)
    prev = aten.slice.Tensor(values, dim, 0, n - 1)
    nxt = aten.slice.Tensor(values, dim, 1, n)
    differs = aten.ne.Tensor(nxt, prev)
    if self.dtype.is_floating_point:
        both_nan = aten.logical_and.default(aten.isnan.default(nxt), aten.isnan.default(prev))
        differs = aten.logical_and.default(differs, aten.logical_not.default(both_nan))
    first = aten.zeros_like.default(aten.slice.Tensor(differs, dim, 0, 1), dtype=torch.int64)
    group = aten.cumsum.default(aten.cat.default([first, aten._to_copy.default(differs, dtype=torch.int64)], dim), dim)
    keys = aten.add.Tensor(aten.mul.Tensor(group, n), index)
    keys, _ = aten.sort.default(keys, dim, False)
    index = aten.remainder.Scalar(keys, n)
    return aten.gather.default(self, dim, index), index


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) without overflow; equal infinities give themselves, NaN propagates."""
    hi, lo = aten.maximum.default(a, b), aten.minimum.default(a, b)
    out = aten.add.Tensor(hi, aten.log1p.default(aten.exp.default(aten.sub.Tensor(lo, hi))))
    same_inf = aten.logical_and.default(aten.isinf.default(hi), aten.eq.Tensor(hi, lo))
    return aten.where.self(same_inf, hi, out)


# NOTE: logcumsumexp has no decomposition; a global shift by the max underflows early terms
# far below it (exp(-1000 - 0) is 0: -inf where eager is finite). The kernel's running
# log-add-exp is associative, so a log-depth scan (as cummax above) applies it: every
# partial combines terms of comparable size. Evaluated in float64 and rounded once (the
# scan's order of additions differs from the kernel's: an approximation under the accuracy
# rule). Complex input is declined.
@project_decomposition(aten.logcumsumexp.default)
def logcumsumexp(self, dim):
    if not self.dtype.is_floating_point:
        return NotImplemented
    if self.dim() == 0:
        return aten.clone.default(self)
    dim = dim % self.dim()
    n = self.shape[dim]
    acc = aten._to_copy.default(self, dtype=torch.float64)
    k = 1
    while k < n:
        pad = aten.full_like.default(aten.slice.Tensor(acc, dim, 0, k), -math.inf)
        prev = aten.cat.default([pad, aten.slice.Tensor(acc, dim, 0, n - k)], dim)
        acc = _log_add_exp(acc, prev)
        k *= 2
    return aten._to_copy.default(acc, dtype=self.dtype, memory_format=torch.contiguous_format)


def _binary_search(seq, values, right):
    """The kernel's binary search, run on every value at once: start/end halve the range
    ``ceil(log2(m + 1))`` times, each value's range only while it is not empty. It goes right
    when ``not (mid >= v)`` (``not (mid > v)`` for ``right``), as the kernel does, so a NaN in
    the sequence or among the values lands where the kernel's search lands (a count of the
    smaller elements would not: the predicate is not monotone around NaN). seq is (B, m),
    values (B, k); returns int64 positions (B, k)."""
    m = seq.shape[-1]
    start = aten.zeros_like.default(values, dtype=torch.int64)
    end = aten.full_like.default(values, m, dtype=torch.int64)
    for _ in range(m.bit_length()):
        active = aten.lt.Tensor(start, end)
        mid = aten.add.Tensor(start, aten.div.Tensor_mode(aten.sub.Tensor(end, start), 2, rounding_mode="floor"))
        at_mid = aten.gather.default(seq, 1, aten.clamp.default(mid, 0, max(m - 1, 0)))
        stop = aten.gt.Tensor(at_mid, values) if right else aten.ge.Tensor(at_mid, values)
        go_right = aten.logical_and.default(active, aten.logical_not.default(stop))
        go_left = aten.logical_and.default(active, stop)
        start = aten.where.self(go_right, aten.add.Tensor(mid, 1), start)
        end = aten.where.self(go_left, mid, end)
    return start


# NOTE: searchsorted has no decomposition that covers its arguments (sorter, batched
# boundaries, the Scalar form). It is the kernel's binary search vectorized (_binary_search):
# exact, NaNs included. sorter reorders the boundaries first (a gather).
@project_decomposition(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        if side not in ("left", "right"):
            return NotImplemented
        if right and side == "left":
            raise RuntimeError(
                "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
            )
        right = side == "right"
    seq = sorted_sequence
    if seq.dim() == 0 or (seq.dim() > 1 and (self.dim() != seq.dim() or list(self.shape[:-1]) != list(seq.shape[:-1]))):
        return NotImplemented  # eager's shape errors: left to a path that raises them
    if sorter is not None:
        seq = aten.gather.default(seq, -1, sorter)
    dtype = torch.int32 if out_int32 else torch.int64
    m = seq.shape[-1]
    if m == 0 or self.numel() == 0:
        return aten.zeros_like.default(self, dtype=dtype, memory_format=torch.contiguous_format)
    common = torch.result_type(seq, self)
    seq = aten._to_copy.default(seq, dtype=common)
    values = aten._to_copy.default(self, dtype=common)
    if seq.dim() == 1:
        flat_seq, flat_values = aten.view.default(seq, [1, m]), aten.reshape.default(values, [1, -1])
    else:
        flat_seq = aten.reshape.default(seq, [-1, m])
        flat_values = aten.reshape.default(values, [flat_seq.shape[0], -1])
    pos = _binary_search(aten.clone.default(flat_seq, memory_format=torch.contiguous_format), flat_values, right)
    return aten._to_copy.default(
        aten.view.default(pos, list(self.shape)), dtype=dtype, memory_format=torch.contiguous_format
    )


@project_decomposition(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorted_sequence.dim() != 1:
        return NotImplemented
    value = aten.scalar_tensor.default(
        self, dtype=torch.result_type(sorted_sequence, self), device=sorted_sequence.device
    )
    return searchsorted(sorted_sequence, value, out_int32=out_int32, right=right, side=side, sorter=sorter)


# NOTE: bincount has no decomposition; its length, max(input) + 1 or minlength, is a data
# value (these calls decompose eagerly, on the bypass path). Counts (or weights) are added at
# each value with index_put(accumulate=True). Weights: float32 stays float32, anything else
# sums in float64, as the kernel's result dtype. Negative input raises the kernel's error.
@project_decomposition(aten.bincount.default)
def bincount(self, weights=None, minlength=0):
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype == torch.bool or minlength < 0:
        return NotImplemented
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        return NotImplemented
    if self.numel() and _item(aten.lt.Scalar(aten.amin.default(self, []), 0)):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    size = max(int(_item(aten.amax.default(self, []))) + 1 if self.numel() else 0, minlength)
    index = aten._to_copy.default(self, dtype=torch.int64)
    if weights is None:
        out = aten.full.default([size], 0, dtype=torch.int64, device=self.device)
        return aten.index_put.default(out, [index], aten.ones_like.default(index), True)
    dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    out = aten.full.default([size], 0, dtype=dtype, device=self.device)
    return aten.index_put.default(out, [index], aten._to_copy.default(weights, dtype=dtype), True)


def _runs(values, return_inverse, return_counts, order=None):
    """Unique runs of a 1-D ``values``: ``(firsts, inverse, counts)`` as unique's kernels return them.

    ``order`` maps positions of ``values`` back to the input's (a sort's indices), if any.
    """
    n = values.shape[0]
    empty = aten.full.default([0], 0, dtype=torch.int64, device=values.device)
    if n == 0:
        return values, empty, empty
    starts = aten.ne.Tensor(aten.slice.Tensor(values, 0, 1), aten.slice.Tensor(values, 0, 0, -1))
    starts = aten.cat.default([aten.full.default([1], True, dtype=torch.bool, device=values.device), starts])
    firsts = aten.index.Tensor(values, [starts])
    group = aten.sub.Tensor(aten.cumsum.default(starts, 0, dtype=torch.int64), 1)
    inverse, counts = empty, empty
    if return_inverse:
        inverse = group if order is None else aten.index_put.default(aten.full_like.default(group, 0), [order], group)
    if return_counts:
        zeros = aten.full.default([firsts.shape[0]], 0, dtype=torch.int64, device=values.device)
        counts = aten.index_put.default(zeros, [group], aten.full_like.default(group, 1), True)
    return firsts, inverse, counts


# NOTE: no decomposition in PyTorch for torch.unique's kernels. Sorting (core) and
# comparing neighbours gives eager's answer exactly: NaNs sort last and, never equal
# to each other, each stays its own value, as in the CPU kernel. With sorted=False the
# order is unspecified; the CPU kernel returns sorted values then too, and so does this.
@project_decomposition(aten._unique2.default)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, order = aten.sort.default(
        aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    )
    firsts, inverse, counts = _runs(values, return_inverse, return_counts, order)
    if return_inverse:
        inverse = aten.view.default(inverse, list(self.shape))
    return firsts, inverse, counts


def unique_consecutive_flat(self, return_inverse=False, return_counts=False):
    """unique_consecutive with dim=None (order.py registers the op and handles dim=)."""
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    firsts, inverse, counts = _runs(flat, return_inverse, return_counts)
    if return_inverse:
        inverse = aten.view.default(inverse, list(self.shape))
    return firsts, inverse, counts


@project_decomposition(aten._unique.default)
def unique(self, sorted=True, return_inverse=False):
    firsts, inverse, _ = unique2(self, sorted, return_inverse, False)
    return firsts, inverse


def _rows(self, dim):
    """self with ``dim`` first (a contiguous copy), and that as [n, rest] rows."""
    moved = aten.clone.default(aten.movedim.int(self, dim, 0), memory_format=torch.contiguous_format)
    rest = 1
    for d, k in enumerate(self.shape):
        rest *= k if d != dim else 1
    return moved, aten.reshape.default(moved, [self.shape[dim], rest])


def _row_runs(rows, moved, dim, order=None):
    """Runs of equal neighbouring rows: the first row of each (taken from ``moved``, at input
    positions ``order`` if given, and moved back to ``dim``: eager's result is that view of a
    dim-first tensor), the run of every row (inverse) and the run lengths.
    A row differs from the previous when any element is unequal (NaN never equals: its own run)."""
    n = rows.shape[0]
    device = moved.device
    if n == 0:
        empty = aten.full.default([0], 0, dtype=torch.int64, device=device)
        return aten.clone.default(aten.movedim.int(moved, 0, dim), memory_format=torch.contiguous_format), empty, empty
    differs = aten.any.dim(aten.ne.Tensor(aten.slice.Tensor(rows, 0, 1), aten.slice.Tensor(rows, 0, 0, n - 1)), 1)
    starts = aten.cat.default([aten.full.default([1], True, dtype=torch.bool, device=device), differs])
    group = aten.sub.Tensor(aten.cumsum.default(starts, 0, dtype=torch.int64), 1)
    first_at = aten.view.default(aten.nonzero.default(starts), [-1])
    if order is not None:
        first_at = aten.index_select.default(order, 0, first_at)
    firsts = aten.movedim.int(aten.index_select.default(moved, 0, first_at), 0, dim)
    counts = aten.index_put.default(
        aten.full.default([first_at.shape[0]], 0, dtype=torch.int64, device=device),
        [group],
        aten.full_like.default(group, 1),
        True,
    )
    if order is not None:
        group = aten.index_put.default(aten.full_like.default(group, 0), [order], group)
    return firsts, group, counts


# NOTE: unique_consecutive(dim=d) compares whole slices along d with their predecessor (any
# unequal element starts a run) and keeps the first of each run; it returns the inverse and
# the counts whether asked or not, as eager does. The number of runs is a data value (bypass
# path). Values are selected, never computed: exact. (dim=None: unique_consecutive_flat above.)
@project_decomposition(aten.unique_consecutive.default)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        return unique_consecutive_flat(self, return_inverse, return_counts)
    if self.dim() == 0:
        return NotImplemented
    dim = dim % self.dim()
    moved, rows = _rows(self, dim)
    return _row_runs(rows, moved, dim)


# NOTE: unique(dim=d) sorts the slices along d lexicographically (the kernel's std::sort with
# an element-wise less-than), then keeps one of each run of equal slices. The order is built
# from stable sorts by one column at a time, last column first (LSD radix sort: after the pass
# on column c, rows are ordered by columns c.. with ties kept in the previous order), so
# equal slices keep their input order and the slice kept is the first. The kernel's sort is
# not stable: where equal-comparing slices differ in their bits (-0.0 and 0.0) its choice is
# unspecified, and NaNs break its ordering; inputs holding either are declined (a data value).
@project_decomposition(aten.unique_dim.default)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    if self.dim() == 0 or self.dtype.is_complex:
        return NotImplemented
    dim = dim % self.dim()
    moved, rows = _rows(self, dim)
    if self.dtype.is_floating_point and rows.numel():
        zero = aten.eq.Scalar(rows, 0)
        negative_zero = aten.logical_and.default(zero, aten.lt.Scalar(aten.reciprocal.default(rows), 0))
        if _item(aten.any.default(aten.logical_or.default(aten.isnan.default(rows), negative_zero))):
            return NotImplemented
    n, m = rows.shape
    order = aten.arange.default(n, device=self.device)
    for c in reversed(range(m)):
        column = aten.index_select.default(aten.select.int(rows, 1, c), 0, order)
        _, perm = sort_stable(column, stable=True, dim=0)
        order = aten.index_select.default(order, 0, perm)
    ordered = aten.index_select.default(rows, 0, order)
    return _row_runs(ordered, moved, dim, order)
