"""histc, histogram and histogramdd as eager's CPU kernels bin, in core ops.

NOTE: PyTorch has no decomposition for these. Eager (Histogram.cpp, cpu/HistogramKernel.cpp)
computes the bin edges with ``linspace_out`` in the input dtype from the outer edges (histc: min
and max, or the data's extrema; histogram: ``range``, or the data's extrema per dimension,
widened by 1/2 when equal), then bins each element (NaN and values outside [first edge, last edge]
skipped, the last bin closed) by one of:

* histc: ``trunc((x - first) * bins / (last - first))`` in the input dtype (16-bit floats round
  after each operation, the bin count itself rounded to the type first);
* histogram/histogramdd with a bin count: that estimate, then ``std::upper_bound`` over the
  edges at estimate - 1 .. estimate + 1, which keeps the result consistent with the returned edges;
* given edge tensors: ``std::upper_bound`` over all of them (a binary search whose probe order
  decides the bin when the edges are not sorted: searchsorted's decomposition reproduces it).

The edges here are spacing.py's replay of eager's linspace, so the first and last edges, the
estimate and the searched edges are eager's bit for bit, and so are the bins. Counts are added
with index_put in the input dtype; weights likewise, in element order (eager adds per thread, then
sums the threads: the same order up to its 200-row grain, rounding-level otherwise). ``density``
divides by the sum and the edge differences as eager does. The outer edges from the data are data
values (read: such calls run on the bypass path), so eager's errors on non-finite ranges are
raised as eager raises them. 16-bit histc adds its counts in the 16-bit type, exact up to 256:
larger inputs are declined.
"""

from __future__ import annotations

import math
import struct

import torch

from eagerdecomp.decompositions.numerics import to_float32
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.decompositions.spacing import _linspace_values
from eagerdecomp.ops.variants import out_variant

aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_F32 = torch.float32


def _item(t):
    return aten._local_scalar_dense.default(t)


def _cast(x, dtype):
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


def _edges(lo, hi, bins, dtype, device):
    """eager's ``linspace_out(bin_edges, lo, hi, bins + 1)`` (1-D, contiguous)."""
    return _linspace_values(lo, hi, bins + 1, dtype, device)


def _estimate(x, first, last, nbins):
    """``static_cast<int64_t>((x - first) * nbins / (last - first))`` in x's dtype (x any shape;
    first, last 0-dim). 16-bit types: float operations rounded to the type after each one."""
    dtype = x.dtype
    if dtype in _HALF:

        def r(v):
            return _cast(_cast(v, dtype), _F32)

        n = r(aten.scalar_tensor.default(float(nbins), dtype=_F32, device=x.device))
        xf, a, b = _cast(x, _F32), _cast(first, _F32), _cast(last, _F32)
        q = r(aten.div.Tensor(r(aten.mul.Tensor(r(aten.sub.Tensor(xf, a)), n)), r(aten.sub.Tensor(b, a))))
    else:
        n = aten.scalar_tensor.default(float(nbins), dtype=dtype, device=x.device)
        q = aten.div.Tensor(aten.mul.Tensor(aten.sub.Tensor(x, first), n), aten.sub.Tensor(last, first))
    return aten._to_copy.default(q, dtype=torch.int64)  # truncation toward zero


def _inside(x, first, last):
    return aten.logical_and.default(aten.ge.Tensor(x, first), aten.le.Tensor(x, last))  # NaN: outside


def _local_search(x, edges, pos):
    """``std::upper_bound(edges + lo, edges + hi, x) - edges - 1`` with lo = max(0, pos - 1),
    hi = min(pos + 2, n): libstdc++'s halving loop, unrolled over its at most 3 elements."""
    n = edges.shape[0]
    first = aten.clamp.default(aten.sub.Tensor(pos, 1), 0)
    length = aten.sub.Tensor(aten.clamp.default(aten.add.Tensor(pos, 2), None, n), first)
    for _ in range(2):  # 3 -> 1 -> 0 or 2 -> 1 -> 0
        half = aten.div.Tensor_mode(length, 2, rounding_mode="floor")
        middle = aten.clamp.default(aten.add.Tensor(first, half), 0, n - 1)
        go_left = aten.lt.Tensor(x, aten.index.Tensor(edges, [middle]))
        live = aten.gt.Scalar(length, 0)
        right = aten.logical_and.default(live, aten.logical_not.default(go_left))
        first = aten.where.self(right, aten.add.Tensor(middle, 1), first)
        length = aten.where.self(
            live, aten.where.self(go_left, half, aten.sub.Tensor(aten.sub.Tensor(length, half), 1)), length
        )
    return aten.sub.Tensor(first, 1)


def _binary_search(x, edges):
    """``std::upper_bound(edges, edges + n, x) - edges - 1`` over all edges (searchsorted's
    kernel runs the same halving loop, probe for probe)."""
    flat = aten.view.default(x, [-1])
    found = aten.searchsorted.Tensor(edges, flat, right=True)
    return aten.view.default(aten.sub.Tensor(found, 1), list(x.shape))


def _accumulate(shape, index, keep, weight, dtype, device):
    """hist[index] += weight (1 when None) for the kept elements, in ``dtype``."""
    ones = aten._to_copy.default(keep, dtype=dtype)
    values = ones if weight is None else aten.where.self(keep, weight, aten.zeros_like.default(weight))
    index = [aten.where.self(keep, i, aten.zeros_like.default(i)) for i in index]
    out = aten.full.default(list(shape), 0, dtype=dtype, device=device)
    return aten.index_put.default(out, index, values, True)


def _density(hist, edges):
    hist = aten.div.Tensor(hist, aten.sum.default(hist))
    d = len(edges)
    for dim, e in enumerate(edges):
        lengths = aten.sub.Tensor(aten.slice.Tensor(e, 0, 1), aten.slice.Tensor(e, 0, 0, -1))
        shape = [1] * d
        shape[dim] = lengths.shape[0]
        hist = aten.div.Tensor(hist, aten.view.default(lengths, shape))
    return hist


def _histogramdd(rows, edges, weight, density, local_search):
    """rows: (M, D) input; edges: D 1-D edge tensors; weight: (M,) or None."""
    dtype, device = rows.dtype, rows.device
    keep = aten.full.default([rows.shape[0]], True, dtype=torch.bool, device=device)
    index = []
    for dim, e in enumerate(edges):
        n = e.shape[0]
        x = aten.select.int(rows, 1, dim)
        first, last = aten.select.int(e, 0, 0), aten.select.int(e, 0, n - 1)
        keep = aten.logical_and.default(keep, _inside(x, first, last))
        if local_search:
            pos = aten.clamp.default(_estimate(x, first, last, n - 1), 0, n - 1)
            pos = _local_search(x, e, pos)
        else:
            pos = _binary_search(x, e)
        pos = aten.where.self(aten.eq.Scalar(pos, n - 1), aten.sub.Tensor(pos, 1), pos)  # the last bin is closed
        index.append(aten.clamp.default(pos, 0, max(n - 2, 0)))
    hist = _accumulate([e.shape[0] - 1 for e in edges], index, keep, weight, dtype, device)
    return _density(hist, edges) if density else hist


def _outer_edges(rows, bins, range_):
    """select_outer_bin_edges: per dimension (lo, hi) as doubles, eager's checks and widening."""
    d = rows.shape[1]
    if range_ is not None:
        if len(range_) != 2 * d:
            raise RuntimeError(
                f"torch.histogramdd: for a {d}-dimensional histogram range should have {2 * d} elements, but got {len(range_)}"  # noqa: E501 (eager's message, kept greppable)
            )
        lo, hi = [float(v) for v in range_[0::2]], [float(v) for v in range_[1::2]]
    elif rows.shape[0] > 0:
        lo = [float(_item(aten.amin.default(aten.select.int(rows, 1, k), []))) for k in range(d)]
        hi = [float(_item(aten.amax.default(aten.select.int(rows, 1, k), []))) for k in range(d)]
    else:
        lo, hi = [0.0] * d, [1.0] * d
    for k in range(d):
        if not (math.isfinite(lo[k]) and math.isfinite(hi[k])):
            raise RuntimeError(f"torch.histogramdd: dimension {k}'s range [{lo[k]}, {hi[k]}] is not finite")
        if not lo[k] <= hi[k]:
            raise RuntimeError(
                f"torch.histogramdd: min should not exceed max, but got min {lo[k]} max {hi[k]} for dimension {k}"
            )
        if lo[k] == hi[k]:
            lo[k], hi[k] = lo[k] - 0.5, hi[k] + 0.5
    for k, b in enumerate(bins):
        if b <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {b} for dimension {k}")
    return lo, hi


def _supported(self, weight) -> bool:
    return self.dtype in (torch.float32, torch.float64) and (weight is None or weight.dtype == self.dtype)


def _weight(weight):
    return None if weight is None else aten.reshape.default(weight, [-1])


@project_decomposition(aten.histogram.bin_ct)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    if not _supported(self, weight):
        return NotImplemented
    rows = aten.reshape.default(self, [-1, 1])
    lo, hi = _outer_edges(rows, [bins], range)
    edges = _edges(lo[0], hi[0], bins, self.dtype, self.device)
    return _histogramdd(rows, [edges], _weight(weight), density, local_search=True), edges


@project_decomposition(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    if not _supported(self, weight) or bins.dtype != self.dtype or bins.dim() != 1 or bins.numel() == 0:
        return NotImplemented  # eager's checks raise there
    rows = aten.reshape.default(self, [-1, 1])
    edges = aten.clone.default(bins, memory_format=torch.contiguous_format)
    return _histogramdd(rows, [edges], _weight(weight), density, local_search=False), edges


def _dd_rows(self, count):
    if self.dim() < 2 or self.shape[-1] != count:
        return None  # eager's checks raise
    return aten.reshape.default(self, [-1, self.shape[-1]])


@project_decomposition(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    rows = _dd_rows(self, len(bins))
    if rows is None or not _supported(self, weight):
        return NotImplemented
    lo, hi = _outer_edges(rows, bins, range)
    return [_edges(lo[k], hi[k], b, self.dtype, self.device) for k, b in enumerate(bins)]


@project_decomposition(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    rows = _dd_rows(self, len(bins))
    if rows is None or not _supported(self, weight):
        return NotImplemented
    lo, hi = _outer_edges(rows, bins, range)
    edges = [_edges(lo[k], hi[k], b, self.dtype, self.device) for k, b in enumerate(bins)]
    return _histogramdd(rows, edges, _weight(weight), density, local_search=True)


@project_decomposition(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    rows = _dd_rows(self, len(bins))
    if rows is None or not _supported(self, weight):
        return NotImplemented
    if any(b.dtype != self.dtype or b.dim() != 1 or b.numel() == 0 for b in bins):
        return NotImplemented
    edges = [aten.clone.default(b, memory_format=torch.contiguous_format) for b in bins]
    return _histogramdd(rows, edges, _weight(weight), density, local_search=False)


# NOTE: mixture-of-experts routers count tokens per expert with histc. Its outer edges are
# min/max, or the data's extrema when they are equal (a data value: such calls run on the bypass
# path), widened by 1 when still equal; the bins are the linear estimate alone (no local search),
# x == last edge in the last bin. 16-bit inputs: the estimate rounds per operation and the counts
# add in the 16-bit type, exact up to 256 elements (larger ones declined); a bin count the 16-bit
# type rounds up (the estimate could pass the last bin: undefined in the kernel) is declined too.
_HALF_MAX_ELEMENTS = 256


def _round16(n: int, dtype) -> float:
    """int64 -> float -> the 16-bit type, round to nearest even (c10's conversions)."""
    f = to_float32(float(n))
    if dtype == torch.float16:
        try:
            return struct.unpack("e", struct.pack("e", f))[0]
        except OverflowError:
            return math.inf
    bits = struct.unpack("I", struct.pack("f", f))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("f", struct.pack("I", bits))[0]


@project_decomposition(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    if not self.dtype.is_floating_point:
        return _histc_int(self, bins, min, max)
    if self.dtype not in (torch.float32, torch.float64) + _HALF:
        return NotImplemented
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if self.dtype in _HALF:
        if self.numel() > _HALF_MAX_ELEMENTS or _round16(bins, self.dtype) > bins:
            return NotImplemented
    elif self.dtype == _F32 and bins > 2**24:
        return NotImplemented
    lo, hi = float(min), float(max)
    if lo == hi and self.numel() > 0:
        lo, hi = float(_item(aten.amin.default(self, []))), float(_item(aten.amax.default(self, [])))
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo}, {hi}] is not finite")
    if not lo < hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    flat = aten.reshape.default(self, [-1])
    edges = _edges(lo, hi, bins, self.dtype, self.device)
    first, last = aten.select.int(edges, 0, 0), aten.select.int(edges, 0, bins)
    keep = _inside(flat, first, last)
    pos = aten.clamp.default(_estimate(flat, first, last, bins), 0, bins)
    pos = aten.where.self(aten.eq.Scalar(pos, bins), aten.sub.Tensor(pos, 1), pos)
    return _accumulate([bins], [pos], keep, None, self.dtype, self.device)


# NOTE: the CPU has no integer histc; CUDA's kernel (what an accelerator's users call, and what
# transformers' MoE routers pass on every device but the CPU) bins integers in integer
# arithmetic: bin = (x - lo) * bins / (hi - lo) with lo and hi truncated to the dtype.
def _histc_int(self, bins, min, max):
    if self.dtype == torch.bool or bins <= 0:
        return NotImplemented
    lo, hi = int(min), int(max)
    if lo == hi and self.numel() > 0:
        lo, hi = int(_item(aten.amin.default(self, []))), int(_item(aten.amax.default(self, [])))
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not lo < hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    flat = aten._to_copy.default(
        aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1]), dtype=torch.int64
    )
    inside = aten.logical_and.default(aten.ge.Scalar(flat, lo), aten.le.Scalar(flat, hi))
    pos = aten.div.Tensor_mode(aten.mul.Tensor(aten.sub.Tensor(flat, lo), bins), hi - lo, rounding_mode="trunc")
    pos = aten.clamp.default(aten.where.self(inside, pos, aten.zeros_like.default(pos)), 0, bins - 1)
    out = aten.full.default([bins], 0, dtype=self.dtype, device=self.device)
    return aten.index_put.default(out, [pos], aten._to_copy.default(inside, dtype=self.dtype), True)


# NOTE: histogram's out= overloads have no meta kernel, and the fake reference the trace is checked
# against keeps the outs' given (empty) shapes where eager resizes them: a traced call is refused.
# bin_ct's out= reads the data's extrema when no range is given (a data value: the call runs on
# the bypass path, where the generic out= rule resizes and copies as eager); with a range or an
# empty input it would trace, and bins_tensor's out= always does: those are declined (no path, a
# clear error) rather than answer past the check. The functional overloads above are exact.
@project_decomposition(aten.histogram.bin_ct_out)
def histogram_bin_ct_out(self, bins=100, *, range=None, weight=None, density=False, hist, bin_edges):
    if range is not None or self.numel() == 0:
        return NotImplemented
    return out_variant(
        aten.histogram.bin_ct_out,
        aten.histogram.bin_ct,
        self,
        bins,
        range=range,
        weight=weight,
        density=density,
        hist=hist,
        bin_edges=bin_edges,
    )


@project_decomposition(aten.histogram.bins_tensor_out)
def histogram_bins_tensor_out(self, bins, *, weight=None, density=False, hist, bin_edges):
    return NotImplemented
