"""Bilinear and bicubic resizing of uint8 images (torchvision's Resize on tensors), bitwise eager.

NOTE: eager's CPU kernel resizes uint8 input in fixed point, one dimension at a time (width,
then height, each only if its size changes), as PIL does: per output position, a window of
input positions and weights computed in double from the sizes alone, the weights scaled to
int16 at a precision chosen so the largest fits in 15 bits, and per pixel
``clamp((2**(p-1) + sum_k x[k] * w[k]) >> p, 0, 255)`` in int32, rounded to uint8 after each
dimension. Its vectorized path and its generic one compute the same integers. The windows
and weights depend on the sizes only, so they are computed here as the kernel computes them
(double arithmetic, and ``floorf``'s float rounding where the kernel calls it) and baked
into the kernel; each pass is then one gather per tap and integer sums, which are exact in
any order. PyTorch's decompositions compute in float and round (off by one level here and
there, and across the whole image for antialiased resizing).

Without antialiasing the window is the interpolation's own (2 taps, or 4 for bicubic with
Keys' a = -0.75, taps past the border folded into the border's weight); with it, the
filter is stretched by the scale (bicubic with a = -0.5, as PIL) and normalized to sum 1.
Float inputs keep PyTorch's decompositions (and antialias.py's).
"""

from __future__ import annotations

import functools
import math

import torch

from eagerdecomp.decompositions.numerics import to_float32
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


def bilinear_filter(x):
    """The bilinear (triangle) filter of eager's resizing kernels, at distance ``x``."""
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def bicubic_filter(x, a=-0.5):
    """Keys' cubic filter with parameter ``a`` (-0.5 for antialiasing, as PIL; -0.75 otherwise)."""
    x = abs(x)
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _scale(n_in, n_out, align_corners, scale):
    """area_pixel_compute_scale<double>."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _window_aa(i, n_in, scale, support, k, fn):
    """(start, length, weights) of output ``i`` with the filter stretched by the scale."""
    center = scale * (i + 0.5)
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    start = max(int(center - support + 0.5), 0)
    length = min(max(min(int(center + support + 0.5), n_in) - start, 0), k)
    ws = [fn((j + start - center + 0.5) * invscale) for j in range(length)]
    total = 0.0
    for w in ws:
        total += w
    peak = 0.0
    if total != 0.0:
        ws = [w / total for w in ws]
        for w in ws:
            peak = max(peak, w)
    return start, length, ws + [0.0] * (k - length), peak


def _window(i, n_in, scale, k, fn, align_corners):
    """The same without antialiasing: the interpolation's taps, those past a border added to
    the border's weight (a running maximum of the partial sums is the kernel's wt_max)."""
    real = scale * i if align_corners else scale * (i + 0.5) - 0.5
    if k <= 2 and not align_corners and real < 0:
        real = 0.0
    index = min(math.floor(to_float32(real)), n_in - 1)  # the kernel's floorf
    lam = min(max(real - index, 0.0), 1.0)
    support = int(k * 0.5)
    lo = index - support + 1
    start = max(lo, 0)
    length = min(max(min(index + support + 1, n_in) - start, 0), k)
    ws, peak, slot = [0.0] * k, 0.0, 0
    for j in range(k):
        ws[j] = 0.0  # (the kernel clears each slot as its loop reaches it)
        w = fn(float(j + 1 - support) - lam)
        if lo + j <= 0:
            slot = 0
        elif lo + j >= n_in - 1:
            slot = length - 1
        ws[slot] += w
        peak = max(peak, ws[slot])
        slot += 1
    return start, length, ws, peak


@functools.lru_cache(maxsize=256)
def _plan(n_in, n_out, align_corners, scale, kind, antialias):
    """(start per output, int16 weights per output and tap, precision) of one dimension."""
    # the same filters as the float antialiased resize; bicubic with Keys' a, per path
    cubic = functools.partial(bicubic_filter, a=-0.5 if antialias else -0.75)
    fn, interp = (bilinear_filter, 2) if kind == "bilinear" else (cubic, 4)
    s = _scale(n_in, n_out, align_corners, scale)
    if antialias:
        support = interp * 0.5 * s if s >= 1.0 else interp * 0.5
        k = int(math.ceil(support)) * 2 + 1
        rows = [_window_aa(i, n_in, s, support, k, fn) for i in range(n_out)]
    else:
        k = interp
        rows = [_window(i, n_in, s, k, fn, align_corners) for i in range(n_out)]
    peak = max((r[3] for r in rows), default=0.0)
    precision = 22
    for p in range(22):
        if int(0.5 + peak * (1 << (p + 1))) >= (1 << 15):
            precision = p
            break
    one = 1 << precision
    weights = [[int(-0.5 + w * one) if w * one < 0 else int(0.5 + w * one) for w in r[2]] for r in rows]
    return tuple(r[0] for r in rows), tuple(map(tuple, weights)), precision


def _pass(x, dim, starts, weights, precision):
    n_in, n_out, k = x.shape[dim], len(starts), len(weights[0])
    wshape = [1] * x.dim()
    wshape[dim] = n_out
    acc = None
    for j in range(k):
        index = torch.tensor([min(s + j, n_in - 1) for s in starts], dtype=torch.int64, device=x.device)
        tap = aten._to_copy.default(aten.index_select.default(x, dim, index), dtype=torch.int32)
        w = torch.tensor([row[j] for row in weights], dtype=torch.int32, device=x.device)
        term = aten.mul.Tensor(tap, aten.view.default(w, wshape))
        acc = term if acc is None else aten.add.Tensor(acc, term)
    acc = aten.add.Tensor(acc, 1 << (precision - 1))  # rounds the shift below to nearest
    acc = aten.div.Tensor_mode(acc, 1 << precision, rounding_mode="floor")  # the kernel's >> (arithmetic)
    return aten._to_copy.default(aten.clamp.default(acc, 0, 255), dtype=torch.uint8)


def resize_uint8(self, output_size, align_corners, scales_h, scales_w, kind, antialias):
    """A [N, C, H, W] uint8 image resized as eager's CPU kernel does, bit for bit."""
    (oh, ow), (ih, iw) = output_size, self.shape[2:]
    x = self
    if ow != iw:
        x = _pass(x, 3, *_plan(iw, ow, align_corners, scales_w, kind, antialias))
    if oh != ih:
        x = _pass(x, 2, *_plan(ih, oh, align_corners, scales_h, kind, antialias))
    return aten.clone.default(x, memory_format=torch._prims_common.suggest_memory_format(self))


def _uint8_or(op, kind):
    from torch._decomp import decomposition_table

    inner = decomposition_table[op]

    @functools.wraps(inner)
    def resize(input, output_size, align_corners, scales_h=None, scales_w=None):
        if input.dtype == torch.uint8 and input.dim() == 4:
            return resize_uint8(input, list(output_size), align_corners, scales_h, scales_w, kind, antialias=False)
        return inner(input, output_size, align_corners, scales_h, scales_w)

    return resize


for _op, _kind in ((aten.upsample_bilinear2d.default, "bilinear"), (aten.upsample_bicubic2d.default, "bicubic")):
    project_decomposition(_op)(_uint8_or(_op, _kind))
