"""Selection along a dim: median, nanmedian, kthvalue and mode, with their CPU kernels' indices
(and median and nanmedian of all elements, which return a value alone).

The values are never in doubt; the index is, wherever values tie. Each decomposition below
takes its index rule from the CPU kernel (``aten/src/ATen/native/Sorting.cpp`` and the ``mode``
kernel of ``TensorCompareKernel.cpp``) and reproduces it exactly, or declines (no path,
a clear error) where it cannot. Results are computed along the last dim of a contiguous
copy and moved back, contiguous, as the kernels allocate them.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.order import _item
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

# NOTE: the mode kernel sorts (value, index) pairs with std::sort. libstdc++ sorts a range
# of at most 16 elements by insertion sort alone, whose result is fully determined (and
# stable but for NaN, below); past 16 it partitions first, and which of several equal
# values ends a run is no longer something core ops can reproduce.
MODE_MAX_SIZE = 16


def _last(self, dim):
    """(self with ``dim`` moved last as a contiguous copy, the dim's size)."""
    moved = aten.clone.default(aten.movedim.int(self, dim, -1), memory_format=torch.contiguous_format)
    return moved, moved.shape[-1]


def _back(moved_result, dim, keepdim):
    """A [..., 1] result along the moved dim, back to eager's layout (contiguous)."""
    if keepdim:
        moved_result = aten.movedim.int(moved_result, -1, dim)
    else:
        moved_result = aten.squeeze.dim(moved_result, -1)
    return aten.clone.default(moved_result, memory_format=torch.contiguous_format)


def _scalar_case(self):
    return aten.clone.default(self), aten.full.default([], 0, dtype=torch.int64, device=self.device)


def _check_size(name, self, dim):
    if self.shape[dim] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {dim % self.dim()} to have non-zero size.")


def _arange_like(moved, n):
    return aten.arange.start_step(0, n, 1, dtype=torch.int64, device=moved.device)


# NOTE: nanmedian of an all-NaN row: its comparator finds every NaN equal to every other,
# so std::nth_element's answer at position 0 is wherever libstdc++'s introselect leaves the
# elements, a function of the row's length alone. This replays that algorithm on equal
# elements (median-of-three pivot moved first, then a partition that swaps from both ends)
# and returns the original index it leaves at position 0.
def _introselect_all_equal(n: int) -> int:
    order = list(range(n))
    first, last, depth = 0, n, 2 * (n.bit_length() - 1) if n else 0
    while last - first > 3:
        if depth == 0:  # unreachable for equal elements: each pass halves the range
            raise AssertionError("introselect fell back to heap select")
        depth -= 1
        mid = first + (last - first) // 2
        order[first], order[mid] = order[mid], order[first]
        lo, hi = first + 1, last
        while True:
            hi -= 1
            if not lo < hi:
                break
            order[lo], order[hi] = order[hi], order[lo]
            lo += 1
        last = lo  # the cut is past position 0 (nth): keep the left part
    return order[0]


# NOTE: median/nanmedian (dim) pick, with std::nth_element, the element ranked
# (size - 1) // 2 under "value, then index": the element at that position of a stable sort,
# which core sort (made stable in order.py) gives directly. median returns the first NaN of
# a row that has one; nanmedian ranks among the row's non-NaN values (NaNs sort last), and
# for an all-NaN row takes the index above. Values are gathered at the index: exact.
def _median_dim(self, dim, keepdim, skip_nan):
    name = "nanmedian" if skip_nan else "median"
    if self.dim() == 0:
        return _scalar_case(self)
    _check_size(name, self, dim)
    moved, n = _last(self, dim)
    _, order = aten.sort.stable(moved, stable=True, dim=-1)
    rank = aten.full.default(list(moved.shape[:-1]) + [1], (n - 1) // 2, dtype=torch.int64, device=moved.device)
    if moved.dtype.is_floating_point:
        nans = aten.sum.dim_IntList(aten.isnan.default(moved), [-1], True)
        if skip_nan:
            kept = aten.sub.Tensor(aten.full_like.default(nans, n), nans)
            # C++ truncates (kept - 1) / 2 towards zero: 0 for an all-NaN row
            rank = aten.div.Tensor_mode(aten.sub.Tensor(kept, 1), 2, rounding_mode="trunc")
        else:
            # NaNs sort last, in their original order: the first NaN is at rank n - nans
            rank = aten.where.self(
                aten.gt.Scalar(nans, 0), aten.sub.Tensor(aten.full_like.default(nans, n), nans), rank
            )
    index = aten.gather.default(order, -1, rank)
    if skip_nan and moved.dtype.is_floating_point:
        all_nan = aten.eq.Scalar(nans, n)
        index = aten.where.self(all_nan, aten.full_like.default(index, _introselect_all_equal(n)), index)
    return _back(aten.gather.default(moved, -1, index), dim, keepdim), _back(index, dim, keepdim)


@project_decomposition(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, skip_nan=False)


@project_decomposition(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, skip_nan=True)


# NOTE: no decomposition in PyTorch for the full reductions. The lower median of the
# sorted values; median propagates NaN, nanmedian skips NaNs (all-NaN gives NaN).
def _lower_median(self, skip_nan: bool):
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    n = flat.shape[0]
    if n == 0:
        return aten.full.default([], float("nan"), dtype=self.dtype, device=self.device)
    values = aten.sort.default(flat)[0]  # NaNs last
    if not self.dtype.is_floating_point:
        return aten.select.int(values, 0, (n - 1) // 2)
    nans = aten.sum.default(aten.isnan.default(flat), dtype=torch.int64)
    if skip_nan:
        count = aten.sub.Tensor(aten.scalar_tensor.default(n, dtype=torch.int64, device=self.device), nans)
        at = aten.clamp.default(aten.floor_divide.default(aten.sub.Tensor(count, 1), 2), 0)
        pick = aten.squeeze.dim(aten.gather.default(values, 0, aten.unsqueeze.default(at, 0)), 0)
        return pick  # with every value NaN, at is 0 and values[0] is NaN
    pick = aten.select.int(values, 0, (n - 1) // 2)
    nan = aten.scalar_tensor.default(float("nan"), dtype=self.dtype, device=self.device)
    return aten.where.self(aten.gt.Scalar(nans, 0), nan, pick)


@project_decomposition(aten.median.default)
def median(self):
    return _lower_median(self, skip_nan=False)


@project_decomposition(aten.nanmedian.default)
def nanmedian(self):
    return _lower_median(self, skip_nan=True)


# NOTE: libstdc++'s insertion sort, the whole of std::sort on at most 16 elements, replayed
# one insertion at a time on all rows at once. Element i goes to the front if it is less
# than element 0; otherwise it moves left past every element it is less than, stopping at
# the first it is not. With NaN (never less, nothing less than it) that is not a sort: a
# NaN stays put and blocks what comes after it, except for an element less than element 0,
# which jumps to the front over it. Each insertion is a gather with a computed permutation.
def _insertion_sort(values):
    n = values.shape[-1]
    pos = _arange_like(values, n)
    index = aten.expand.default(pos, list(values.shape))
    for i in range(1, n):
        val = aten.slice.Tensor(values, -1, i, i + 1)
        front = aten.lt.Tensor(val, aten.slice.Tensor(values, -1, 0, 1))
        less = aten.lt.Tensor(val, aten.slice.Tensor(values, -1, 0, i))
        stop = aten.amax.default(
            aten.where.self(less, aten.full_like.default(less, -1, dtype=torch.int64), aten.slice.Tensor(pos, 0, 0, i)),
            [-1],
            True,
        )
        to = aten.where.self(front, aten.zeros_like.default(stop), aten.add.Tensor(stop, 1))
        # source of each position: itself before ``to`` and after i, i at ``to``, its left neighbour between
        source = aten.where.self(
            aten.lt.Tensor(pos, to),
            pos,
            aten.where.self(
                aten.eq.Tensor(pos, to),
                aten.full_like.default(to, i),
                aten.where.self(aten.le.Scalar(pos, i), aten.sub.Tensor(pos, 1), pos),
            ),
        )
        values = aten.gather.default(values, -1, source)
        index = aten.gather.default(index, -1, source)
    return values, index


# NOTE: the mode kernel scans the sorted pairs and keeps the first run (in sorted order)
# longer than every run before it: the smallest value of greatest count. Its index is the
# original index of that run's last element; a NaN is a run of its own (NaN != NaN). Rows
# longer than MODE_MAX_SIZE have no path (see there). Without NaN the insertion sort is a
# stable sort, which core sort gives in fewer ops.
@project_decomposition(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    if self.dim() == 0:
        return _scalar_case(self)
    _check_size("mode", self, dim)
    if self.shape[dim] > MODE_MAX_SIZE:
        return NotImplemented
    moved, n = _last(self, dim)
    if moved.dtype.is_floating_point:
        values, index = _insertion_sort(moved)
    else:
        values, index = aten.sort.stable(moved, stable=True, dim=-1)
    pos = _arange_like(moved, n)
    ends = aten.ne.Tensor(aten.slice.Tensor(values, -1, 0, n - 1), aten.slice.Tensor(values, -1, 1, n))
    ends = aten.cat.default(
        [ends, aten.full.default(list(moved.shape[:-1]) + [1], True, dtype=torch.bool, device=moved.device)], -1
    )
    # the end of the previous run before each position: the greatest earlier end, or -1
    earlier = aten.logical_and.default(
        aten.unsqueeze.default(ends, -2), aten.lt.Tensor(aten.unsqueeze.default(pos, 0), aten.unsqueeze.default(pos, 1))
    )
    previous = aten.amax.default(
        aten.where.self(earlier, pos, aten.full.default([], -1, dtype=torch.int64, device=moved.device)), [-1]
    )
    run = aten.where.self(ends, aten.sub.Tensor(pos, previous), aten.zeros_like.default(previous))
    longest = aten.eq.Tensor(run, aten.amax.default(run, [-1], True))
    at = aten.amin.default(
        aten.where.self(longest, pos, aten.full.default([], n, dtype=torch.int64, device=moved.device)), [-1], True
    )
    return _back(aten.gather.default(values, -1, at), dim, keepdim), _back(
        aten.gather.default(index, -1, at), dim, keepdim
    )


# NOTE: kthvalue's CPU kernel runs a quickselect (median-of-three pivot, Sedgewick's
# partition) with no tie-break: which of several equal values it returns depends on the
# algorithm's swaps. Where the k-th value is unique in its row, its index is that of the
# stable sort's k-th element, in core ops. Where it ties (an integer row, usually), this
# reads the tied rows back to the host and replays the kernel's quickselect on them. That
# check reads a data value, so kthvalue decomposes eagerly on every call (not cached).
@project_decomposition(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.dim() == 0:
        if k != 1:
            raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim}")
        return _scalar_case(self)
    _check_size("kthvalue", self, dim)
    if not 1 <= k <= self.shape[dim]:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim % self.dim()}")
    moved, n = _last(self, dim)
    _, order = aten.sort.stable(moved, stable=True, dim=-1)
    index = aten.slice.Tensor(order, -1, k - 1, k)
    value = aten.gather.default(moved, -1, index)
    same = aten.eq.Tensor(moved, value)
    if moved.dtype.is_floating_point:  # NaNs tie with each other in the kernel's comparator
        nan = aten.isnan.default(moved)
        same = aten.where.self(aten.isnan.default(value), nan, same)
    tied = aten.view.default(aten.gt.Scalar(aten.sum.dim_IntList(same, [-1]), 1), [-1])
    if _item(aten.any.default(tied)):
        index = _quickselect_rows(moved, k, tied, index)
        value = aten.gather.default(moved, -1, index)
    return _back(value, dim, keepdim), _back(index, dim, keepdim)


def _quickselect_rows(moved, k, tied, index):
    """``index`` with each tied row's entry replaced by the kernel's quickselect answer."""
    rows = aten.view.default(aten.nonzero.default(tied), [-1])
    flat = aten.view.default(moved, [-1, moved.shape[-1]])
    host = aten._to_copy.default(aten.index_select.default(flat, 0, rows), device=torch.device("cpu"))
    picks = [_quickselect(row, k - 1) for row in host.tolist()]
    picked = aten._to_copy.default(torch.tensor(picks, dtype=torch.int64), device=moved.device)
    flat_index = aten.index_put.default(aten.view.default(index, [-1]), [rows], picked)
    return aten.view.default(flat_index, list(index.shape))


def _quickselect(values, k):
    """The original index the CPU kernel's quickselect leaves at position ``k`` of ``values``."""

    def gt_or_nan(x, y):  # the kernel's comparator: NaN above everything, then >
        return (x != x and y == y) or x > y

    arr, idx = list(values), list(range(len(values)))

    def swap(i, j):
        arr[i], arr[j] = arr[j], arr[i]
        idx[i], idx[j] = idx[j], idx[i]

    left, right = 0, len(arr) - 1
    while True:
        if right <= left:
            return idx[k]
        if right == left + 1:
            if gt_or_nan(arr[left], arr[right]):
                swap(left, right)
            return idx[k]
        mid = (left + right) >> 1
        swap(mid, left + 1)
        if gt_or_nan(arr[left + 1], arr[right]):
            swap(left + 1, right)
        if gt_or_nan(arr[left], arr[right]):
            swap(left, right)
        if gt_or_nan(arr[left + 1], arr[left]):
            swap(left + 1, left)
        i, j, pivot = left + 1, right, arr[left]
        while True:
            i += 1
            while gt_or_nan(pivot, arr[i]):
                i += 1
            j -= 1
            while gt_or_nan(arr[j], pivot):
                j -= 1
            if j < i:
                break
            swap(i, j)
        swap(left, j)
        if j <= k:
            left = i
        if j >= k:
            right = j - 1
