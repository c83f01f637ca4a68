"""Antialiased resizing (``interpolate(..., antialias=True)``, torchvision's Resize on tensors).

NOTE: no decomposition in PyTorch. The CPU kernel resizes one dim at a time, width first,
each output i averaging the inputs under a filter stretched by the scale (bilinear: the
triangle over 2 taps; bicubic: Keys' cubic, a = -0.5, over 4), as PIL does: center =
scale * (i + 0.5), taps from int(center - support + 0.5) to int(center + support + 0.5),
weights normalized to sum 1. The taps and weights depend only on the sizes, so they are
computed here, in the kernel's precision step by step (float32 for float input: each
operation rounded), and baked into the kernel; each pass is then a gather and the
weighted sum in the kernel's order (the kernel may fuse multiply-adds: results agree to a
unit or two in the last place, not bitwise). The backward sends each output gradient back along the
same taps. The kernel has float and double, and a fixed-point uint8 path (resample.py).
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.numerics import to_float32  # a float rounded to float32, as a C++ float receives it
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.decompositions.resample import bicubic_filter, bilinear_filter, resize_uint8

aten = torch.ops.aten


_FILTERS = {"bilinear": (bilinear_filter, 2), "bicubic": (bicubic_filter, 4)}


def _scale(n_in, n_out, align_corners, scale, r):
    """area_pixel_compute_scale in the kernel's precision (``r`` rounds to it)."""
    if align_corners:
        return r((n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return r(1.0 / scale)
    return r(n_in / n_out)


def _taps(n_in, n_out, align_corners, scale, kind, dtype):
    """([n_out, K] input indices, [n_out, K] weights) of one dim, as the kernel computes them."""
    r = to_float32 if dtype == torch.float32 else float
    fn, interp = _FILTERS[kind]
    s = _scale(n_in, n_out, align_corners, scale, r)
    support = r(interp * 0.5 * s) if s >= 1.0 else r(interp * 0.5)
    k = int(math.ceil(support)) * 2 + 1
    invscale = r(1.0 / s) if s >= 1.0 else 1.0
    index, weight = [], []
    for i in range(n_out):
        center = r(s * (i + 0.5))
        xmin = max(int(r(center - support) + 0.5), 0)
        xsize = min(max(min(int(r(center + support) + 0.5), n_in) - xmin, 0), k)
        ws, total = [], 0.0
        for j in range(xsize):
            w = r(fn(r(r((j + xmin) - center) + 0.5) * invscale))
            if dtype == torch.float32:  # the filter itself runs in float
                w = r(w)
            ws.append(w)
            total = r(total + w)
        if total != 0.0:
            ws = [r(w / total) for w in ws]
        index.append([min(xmin + j, n_in - 1) for j in range(k)])
        weight.append(ws + [0.0] * (k - xsize))
    return index, weight


def _constants(index, weight, dtype, device):
    idx = aten._to_copy.default(torch.tensor(index, dtype=torch.int64), device=device)
    w = aten._to_copy.default(torch.tensor(weight, dtype=dtype), device=device)
    return idx, w


def _pass(x, dim, index, weight):
    """Resize ``x`` along ``dim``: out[i] = sum_j w[i, j] x[index[i, j]], summed in order j."""
    n_out, k = len(index), len(index[0])
    idx, w = _constants(index, weight, x.dtype, x.device)
    gathered = aten.index_select.default(x, dim, aten.view.default(idx, [-1]))
    shape = list(x.shape)
    gathered = aten.view.default(gathered, shape[:dim] + [n_out, k] + shape[dim + 1 :])
    wshape = [1] * (x.dim() + 1)
    wshape[dim], wshape[dim + 1] = n_out, k
    w = aten.view.default(w, wshape)
    out = None
    for j in range(k):
        term = aten.mul.Tensor(aten.select.int(gathered, dim + 1, j), aten.select.int(w, dim + 1, j))
        out = term if out is None else aten.add.Tensor(out, term)
    return out


def _resize(self, output_size, align_corners, scales_h, scales_w, kind):
    if self.dtype == torch.uint8 and self.dim() == 4:  # the kernel's fixed-point path
        return resize_uint8(self, output_size, align_corners, scales_h, scales_w, kind, antialias=True)
    if self.dtype not in (torch.float32, torch.float64) or self.dim() != 4:
        return NotImplemented
    (oh, ow), (ih, iw) = output_size, self.shape[2:]
    x = self
    if (oh, ow) == (ih, iw):
        return aten.clone.default(self, memory_format=torch.contiguous_format)
    if ow != iw:
        x = _pass(x, 3, *_taps(iw, ow, align_corners, scales_w, kind, self.dtype))
    if oh != ih:
        x = _pass(x, 2, *_taps(ih, oh, align_corners, scales_h, kind, self.dtype))
    return aten.clone.default(x, memory_format=torch.contiguous_format)


def _resize_backward(grad_output, output_size, input_size, align_corners, scales_h, scales_w, kind):
    if grad_output.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    (oh, ow), (_, _, ih, iw) = output_size, input_size
    g = grad_output
    for dim, n_in, n_out, scale in ((2, ih, oh, scales_h), (3, iw, ow, scales_w)):
        index, weight = _taps(n_in, n_out, align_corners, scale, kind, g.dtype)
        idx, w = _constants(index, weight, g.dtype, g.device)
        k = len(index[0])
        wshape = [1] * (g.dim() + 1)
        wshape[dim], wshape[dim + 1] = n_out, k
        contrib = aten.mul.Tensor(aten.unsqueeze.default(g, dim + 1), aten.view.default(w, wshape))
        shape = list(g.shape)
        contrib = aten.reshape.default(contrib, shape[:dim] + [n_out * k] + shape[dim + 1 :])
        moved = aten.movedim.int(contrib, dim, 0)
        zeros = aten.full.default([n_in] + list(moved.shape[1:]), 0, dtype=g.dtype, device=g.device)
        g = aten.movedim.int(aten.index_put.default(zeros, [aten.view.default(idx, [-1])], moved, True), 0, dim)
    return aten.clone.default(g, memory_format=torch.contiguous_format)


@project_decomposition(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _resize(self, list(output_size), align_corners, scales_h, scales_w, "bilinear")


@project_decomposition(aten._upsample_bicubic2d_aa.default)
def upsample_bicubic2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _resize(self, list(output_size), align_corners, scales_h, scales_w, "bicubic")


@project_decomposition(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _resize_backward(
        grad_output, list(output_size), list(input_size), align_corners, scales_h, scales_w, "bilinear"
    )


@project_decomposition(aten._upsample_bicubic2d_aa_backward.default)
def upsample_bicubic2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _resize_backward(
        grad_output, list(output_size), list(input_size), align_corners, scales_h, scales_w, "bicubic"
    )
