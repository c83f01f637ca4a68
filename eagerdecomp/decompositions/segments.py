"""segment_reduce and its backward as eager's CPU kernels compute them, in core ops.

NOTE: PyTorch has no decomposition for these. The kernel (SegmentReduce.cpp) reduces along the
last dimension of ``lengths`` (or ``offsets``), one segment after another, each element of a
segment folded into a running value in order, in the data's dtype: max/min keep a NaN once met
(``std::max``/``std::min`` otherwise, ties keeping the running value), sum/mean add, prod
multiplies, starting from ``initial`` (or the reduction's identity); a mean divides by the length
(16-bit: the length rounded to the type first) unless the segment is empty (NaN without
``initial``) or the value NaN. Here the segments run side by side: step j folds each segment's
j-th element where the segment has one (a gather at start + j, masked), so the order, and so the
rounding, is the kernel's, with no data value read. The backward is the kernel's too: max/min
pass the gradient to every element equal to the result (or NaN) and, when two or more do, divide
the positive ones by that count (the kernel's own rule); mean divides by the length; prod divides
the product by the element, or multiplies the other elements in order where the element is 0 or
NaN. eager's argument checks (``unsafe=False``: lengths non-negative and summing to the axis)
read the lengths, so such calls run on the bypass path and raise eager's errors; offsets are read
too: segments reaching outside the data (undefined in the kernel) are declined, and without
``unsafe`` only rows running from 0 to the axis size are answered. ``indices=``
(unsupported by eager too) and an ``axis`` that is not the last dimension of lengths are declined.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_REDUCTIONS = ("max", "min", "sum", "mean", "prod")
_HALF = (torch.float16, torch.bfloat16)


def _item(t):
    return aten._local_scalar_dense.default(t)


def _layout(data, bounds, offsets_like):
    """(O, A, I) view of data, the reduction axis, and (O, S) start/length tensors."""
    axis = bounds.dim() - 1
    outer = 1
    for n in data.shape[:axis]:
        outer *= n
    inner = 1
    for n in data.shape[axis + 1 :]:
        inner *= n
    size = data.shape[axis]
    view = aten.reshape.default(aten.clone.default(data, memory_format=torch.contiguous_format), [outer, size, inner])
    rows = aten.reshape.default(aten._to_copy.default(bounds, dtype=torch.int64), [outer, -1])
    if offsets_like:
        starts = aten.slice.Tensor(rows, 1, 0, -1)
        lengths = aten.sub.Tensor(aten.slice.Tensor(rows, 1, 1), starts)
    else:
        lengths = rows
        starts = aten.sub.Tensor(aten.cumsum.default(rows, 1), rows)
    return axis, view, starts, lengths


def _identity(reduce, initial, dtype, device):
    if initial is not None:
        value = initial
    else:
        value = {"max": float("-inf"), "min": float("inf"), "sum": 0, "mean": 0, "prod": 1}[reduce]
    return aten.scalar_tensor.default(value, dtype=dtype, device=device)


def _element(view, starts, j):
    """The j-th element of every segment: (O, S, I), gathered at start + j (clamped)."""
    size = view.shape[1]
    index = aten.clamp.default(aten.add.Tensor(starts, j), 0, max(size - 1, 0))
    index = aten.expand.default(aten.unsqueeze.default(index, 2), [starts.shape[0], starts.shape[1], view.shape[2]])
    return aten.gather.default(view, 1, index)


def _fold(reduce, acc, value):
    if reduce in ("sum", "mean"):
        return aten.add.Tensor(acc, value)
    if reduce == "prod":
        return aten.mul.Tensor(acc, value)
    better = aten.lt.Tensor(acc, value) if reduce == "max" else aten.lt.Tensor(value, acc)
    kept = aten.where.self(better, value, acc)
    return aten.where.self(aten.isnan.default(value), value, kept)


def _divide_by_count(x, count):
    """scalar_t / int64_t as c10 does it (16-bit: the count rounded to the type first)."""
    n = aten._to_copy.default(count, dtype=x.dtype)
    return aten.div.Tensor(x, n)


def _check(data, reduce, lengths, indices, offsets, axis, unsafe):
    """The bounds tensor to reduce by, or None to decline; raises eager's argument errors."""
    if indices is not None or reduce not in _REDUCTIONS or not data.dtype.is_floating_point:
        return None
    bounds = lengths if lengths is not None else offsets
    if bounds is None or (lengths is not None and offsets is not None):
        return None
    if data.dim() == 0 or bounds.dim() > data.dim() or axis % data.dim() != bounds.dim() - 1 or not bounds.numel():
        return None
    size = data.shape[axis % data.dim()]
    if lengths is not None:
        if not unsafe:
            if int(_item(aten.amin.default(lengths, []))) < 0:
                raise RuntimeError("lengths contains negative value!")
            if bool(_item(aten.any.default(aten.ne.Scalar(aten.sum.dim_IntList(lengths, [-1]), size)))):
                raise RuntimeError(
                    "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) when !unsafe."  # noqa: E501 (eager's message, kept greppable)
                )
        elif (
            int(_item(aten.amin.default(lengths, []))) < 0
            or int(_item(aten.amax.default(aten.sum.dim_IntList(lengths, [-1]), []))) > size
        ):
            return None  # the kernel would read outside the data: undefined, declined
        return bounds
    # offsets: segments must stay inside the data (else the kernel reads outside it); eager's own
    # checks of offsets are not replayed, so without unsafe only rows from 0 to the size are answered
    steps = aten.sub.Tensor(aten.slice.Tensor(offsets, -1, 1), aten.slice.Tensor(offsets, -1, 0, -1))
    first, last = aten.select.int(offsets, -1, 0), aten.select.int(offsets, -1, offsets.shape[-1] - 1)
    outside = aten.logical_or.default(aten.lt.Scalar(first, 0), aten.gt.Scalar(last, size))
    if steps.numel() and int(_item(aten.amin.default(steps, []))) < 0:
        return None
    if bool(_item(aten.any.default(outside))):
        return None
    if not unsafe and bool(
        _item(aten.any.default(aten.logical_or.default(aten.ne.Scalar(first, 0), aten.ne.Scalar(last, size))))
    ):
        return None
    return bounds


@project_decomposition(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    bounds = _check(data, reduce, lengths, indices, offsets, axis, unsafe)
    if bounds is None:
        return NotImplemented
    axis, view, starts, seg_len = _layout(data, bounds, offsets is not None)
    outer, segments, inner = view.shape[0], starts.shape[1], view.shape[2]
    acc = aten.expand.default(_identity(reduce, initial, data.dtype, data.device), [outer, segments, inner])
    acc = aten.clone.default(acc)
    lengths3 = aten.unsqueeze.default(seg_len, 2)
    for j in range(view.shape[1]):
        live = aten.gt.Scalar(lengths3, j)
        acc = aten.where.self(live, _fold(reduce, acc, _element(view, starts, j)), acc)
    if reduce == "mean":
        empty = aten.eq.Scalar(lengths3, 0)
        divided = _divide_by_count(acc, aten.expand.default(lengths3, list(acc.shape)))
        divide = aten.logical_and.default(
            aten.logical_not.default(empty), aten.logical_not.default(aten.isnan.default(acc))
        )
        acc = aten.where.self(divide, divided, acc)
        if initial is None:
            acc = aten.where.self(empty, aten.full_like.default(acc, float("nan")), acc)
    shape = list(data.shape)
    shape[axis] = segments
    return aten.reshape.default(acc, shape)


@project_decomposition(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    bounds = _check(data, reduce, lengths, None, offsets, axis, True)
    if bounds is None or grad.dtype != data.dtype:
        return NotImplemented
    axis, view, starts, seg_len = _layout(data, bounds, offsets is not None)
    outer, size, inner = view.shape
    segments = starts.shape[1]
    g = aten.reshape.default(aten.clone.default(grad, memory_format=torch.contiguous_format), [outer, segments, inner])
    out = aten.reshape.default(
        aten.clone.default(output, memory_format=torch.contiguous_format), [outer, segments, inner]
    )
    # each data position's segment and rank in it (positions outside every segment get no gradient)
    pos = aten.arange.start_step(0, size, 1, dtype=torch.int64, device=data.device)
    ends = aten.add.Tensor(starts, seg_len)
    positions = aten.clone.default(
        aten.expand.default(aten.unsqueeze.default(pos, 0), [outer, size]), memory_format=torch.contiguous_format
    )
    seg = aten.searchsorted.Tensor(
        aten.clone.default(ends, memory_format=torch.contiguous_format), positions, right=True
    )
    inside = aten.lt.Scalar(seg, segments)
    seg = aten.clamp.default(seg, 0, max(segments - 1, 0))
    inside = aten.logical_and.default(inside, aten.ge.Tensor(pos, aten.gather.default(starts, 1, seg)))
    inside = aten.logical_and.default(inside, aten.gt.Scalar(aten.gather.default(seg_len, 1, seg), 0))
    index = aten.expand.default(aten.unsqueeze.default(seg, 2), [outer, size, inner])
    g_at = aten.gather.default(g, 1, index)
    out_at = aten.gather.default(out, 1, index)
    len_at = aten.gather.default(seg_len, 1, seg)
    zero = aten.zeros_like.default(view)
    if reduce in ("max", "min"):
        mark = aten.logical_or.default(aten.isnan.default(view), aten.eq.Tensor(view, out_at))
        mark = aten.logical_and.default(mark, aten.unsqueeze.default(inside, 2))
        gi = aten.where.self(mark, g_at, zero)
        counts = aten.zeros_like.default(out, dtype=torch.int64)
        counts = aten.scatter_add.default(counts, 1, index, aten._to_copy.default(mark, dtype=torch.int64))
        count_at = aten.gather.default(counts, 1, index)
        average = aten.logical_and.default(aten.ge.Scalar(count_at, 2), aten.gt.Scalar(gi, 0))
        gi = aten.where.self(average, _divide_by_count(gi, count_at), gi)
    elif reduce == "mean":
        share = _divide_by_count(g_at, aten.expand.default(aten.unsqueeze.default(len_at, 2), [outer, size, inner]))
        gi = aten.where.self(aten.unsqueeze.default(inside, 2), share, zero)
    elif reduce == "sum":
        gi = aten.where.self(aten.unsqueeze.default(inside, 2), g_at, zero)
    else:  # prod
        gval = aten.mul.Tensor(g_at, out_at)
        plain = aten.div.Tensor(gval, view)
        # the product of the segment's other elements, in order, from initial (or 1)
        rank = aten.sub.Tensor(aten.unsqueeze.default(pos, 0), aten.gather.default(starts, 1, seg))
        start_at = aten.gather.default(starts, 1, seg)
        excl = aten.clone.default(
            aten.expand.default(_identity("prod", initial, data.dtype, data.device), [outer, size, inner])
        )
        for k in range(size):
            other = aten.clamp.default(aten.add.Tensor(start_at, k), 0, size - 1)
            value = aten.gather.default(
                view, 1, aten.expand.default(aten.unsqueeze.default(other, 2), [outer, size, inner])
            )
            use = aten.logical_and.default(aten.gt.Scalar(len_at, k), aten.ne.Scalar(rank, k))
            excl = aten.where.self(aten.unsqueeze.default(use, 2), aten.mul.Tensor(excl, value), excl)
        special = aten.logical_or.default(aten.isnan.default(view), aten.eq.Scalar(view, 0))
        gi = aten.where.self(special, aten.mul.Tensor(g_at, excl), plain)
        gi = aten.where.self(aten.unsqueeze.default(inside, 2), gi, zero)
    return aten.reshape.default(gi, list(data.shape))
