"""Backward ops with no decomposition in PyTorch's tables, each the transpose of its forward:
upsampling (linear, bicubic, nearest), pooling, padding, shrinkage, masked_scatter, weight
norm and distances.

Checked against autograd of the native forward (tests/decompositions/test_fills.py) and by the
conformance suite's float64 gradients. Sums run in the opmath dtype (float32 for
16-bit floats) as the CPU kernels do, so results agree to rounding, not bitwise.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch

from eagerdecomp.decompositions.numerics import cast, opmath
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_REDUCED = (torch.float16, torch.bfloat16)


# NOTE: weight_norm (wav2vec2's positional convolution, older vision models) saves v, g and
# the norms of v over every dimension but `dim`; w = g * v / ||v||. Its backward is the
# derivative of that map: grad_g = <grad_w, v> / ||v||, grad_v = g / ||v|| * (grad_w - v <grad_w, v> / ||v||^2).
@project_decomposition(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    acc = opmath(saved_v.dtype)
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    gw, v, g, norms = (cast(t, acc) for t in (grad_w, saved_v, saved_g, saved_norms))
    norms = aten.view.default(norms, list(g.shape))
    dot = aten.sum.dim_IntList(aten.mul.Tensor(gw, v), dims, True) if dims else aten.mul.Tensor(gw, v)
    grad_g = aten.div.Tensor(dot, norms)
    scaled = aten.div.Tensor(aten.mul.Tensor(v, dot), aten.mul.Tensor(norms, norms))
    grad_v = aten.mul.Tensor(aten.div.Tensor(g, norms), aten.sub.Tensor(gw, scaled))
    return cast(grad_v, saved_v.dtype), cast(grad_g, saved_g.dtype)


# NOTE: bicubic upsampling (vision transformers resizing position embeddings, image
# models) has a decomposed forward but no backward. Each output gradient goes back to the
# 4x4 input taps it was blended from (indices clamped to the border, as the forward reads
# them), weighted by the cubic convolution coefficients (A = -0.75) of the CPU kernel.
_A = -0.75


def _cubic_weights(t):
    def near(x):  # |x| <= 1
        return aten.add.Tensor(
            aten.mul.Tensor(aten.mul.Tensor(aten.sub.Tensor(aten.mul.Tensor(x, _A + 2), _A + 3), x), x), 1
        )

    def far(x):  # 1 < |x| < 2
        inner = aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(aten.mul.Tensor(x, _A), 5 * _A), x), 8 * _A)
        return aten.sub.Tensor(aten.mul.Tensor(inner, x), 4 * _A)

    one = aten.rsub.Scalar(t, 1.0)
    return [far(aten.add.Tensor(t, 1.0)), near(t), near(one), far(aten.add.Tensor(one, 1.0))]


def _cubic_source(in_size, out_size, align_corners, scale, dtype, device):
    if align_corners:
        step = (in_size - 1.0) / (out_size - 1.0) if out_size > 1 else 0.0
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    dst = cast(aten.arange.start_step(0, out_size, 1, device=device), dtype)
    src = (
        aten.mul.Tensor(dst, step)
        if align_corners
        else aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(dst, 0.5), step), 0.5)
    )
    floor = aten.floor.default(src)
    base = cast(floor, torch.int64)
    taps = [aten.clamp.default(aten.add.Tensor(base, k - 1), 0, in_size - 1) for k in range(4)]
    return list(zip(taps, _cubic_weights(aten.sub.Tensor(src, floor))))


@project_decomposition(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    acc = opmath(grad_output.dtype)
    grad = cast(grad_output, acc)
    (oh, ow), (ih, iw) = output_size, input_size[2:]
    rows = [
        (aten.view.default(i, [oh, 1]), aten.view.default(w, [oh, 1]))
        for i, w in _cubic_source(ih, oh, align_corners, scales_h, acc, grad.device)
    ]
    cols = _cubic_source(iw, ow, align_corners, scales_w, acc, grad.device)
    out = aten.full.default(list(input_size), 0, dtype=acc, device=grad.device)
    for (ri, rw), (ci, cw) in itertools.product(rows, cols):
        out = aten.index_put.default(out, [None, None, ri, ci], aten.mul.Tensor(grad, aten.mul.Tensor(rw, cw)), True)
    return cast(out, grad_output.dtype)


# NOTE: PyTorch decomposes the linear upsampling forwards but not their backwards, which
# every segmentation or U-Net training step meets. The backward of a linear map is its
# transpose: each output gradient goes back to the 2**d input corners it was blended
# from, weighted as in the forward, accumulated with index_put (core). Sums run in the
# opmath dtype, so results are exact to rounding, not bitwise.
def _linear_source(in_size, out_size, align_corners, scale, dtype, device):
    if align_corners:
        step = (in_size - 1.0) / (out_size - 1.0) if out_size > 1 else 0.0
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    dst = aten._to_copy.default(aten.arange.start_step(0, out_size, 1, device=device), dtype=dtype)
    src = (
        aten.mul.Tensor(dst, step)
        if align_corners
        else aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(dst, 0.5), step), 0.5)
    )
    src = aten.clamp.default(src, 0.0)
    lo = aten._to_copy.default(src, dtype=torch.int64)
    hi = aten.clamp.default(aten.add.Tensor(lo, 1), None, in_size - 1)
    frac = aten.clamp.default(aten.sub.Tensor(src, lo), 0.0, 1.0)
    return (lo, aten.rsub.Scalar(frac, 1.0)), (hi, frac)


def _upsample_linear_backward(grad_output, output_size, input_size, align_corners, scales):
    acc = torch.float32 if grad_output.dtype in (torch.float16, torch.bfloat16) else grad_output.dtype
    grad = aten._to_copy.default(grad_output, dtype=acc)
    d = len(output_size)
    corners = []
    for k, (i, o, s) in enumerate(zip(input_size[2:], output_size, scales)):
        shape = [o] + [1] * (d - 1 - k)  # broadcast along this spatial dim only
        corners.append(
            [
                (aten.view.default(ix, shape), aten.view.default(w, shape))
                for ix, w in _linear_source(i, o, align_corners, s, acc, grad.device)
            ]
        )
    out = aten.full.default(list(input_size), 0, dtype=acc, device=grad.device)
    for pick in itertools.product(*corners):
        weight = functools.reduce(aten.mul.Tensor, [w for _, w in pick])
        out = aten.index_put.default(out, [None, None, *[ix for ix, _ in pick]], aten.mul.Tensor(grad, weight), True)
    return aten._to_copy.default(out, dtype=grad_output.dtype)


@project_decomposition(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    return _upsample_linear_backward(grad_output, output_size, input_size, align_corners, [scales])


@project_decomposition(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear_backward(grad_output, output_size, input_size, align_corners, [scales_h, scales_w])


@project_decomposition(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(
    grad_output, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
    return _upsample_linear_backward(
        grad_output, output_size, input_size, align_corners, [scales_d, scales_h, scales_w]
    )


# NOTE: the nearest-neighbour upsampling backwards have no decomposition in PyTorch
# either. Each output gradient goes back to the one input it was copied from, with the
# index computed as the CPU kernels do (in float32: floor(dst * scale), or
# floor((dst + 0.5) * scale) for the "exact" variants, clamped to the input).
def _nearest_source(in_size, out_size, scale, exact, device):
    step = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    dst = aten._to_copy.default(aten.arange.start_step(0, out_size, 1, device=device), dtype=torch.float32)
    src = aten.mul.Tensor(aten.add.Tensor(dst, 0.5) if exact else dst, step)
    src = aten._to_copy.default(aten.floor.default(src), dtype=torch.int64)
    return aten.clamp.default(src, None, in_size - 1)


def _upsample_nearest_backward(grad_output, output_size, input_size, scales, exact):
    acc = torch.float32 if grad_output.dtype in (torch.float16, torch.bfloat16) else grad_output.dtype
    d = len(output_size)
    index = [
        aten.view.default(_nearest_source(i, o, s, exact, grad_output.device), [o] + [1] * (d - 1 - k))
        for k, (i, o, s) in enumerate(zip(input_size[2:], output_size, scales))
    ]
    out = aten.full.default(list(input_size), 0, dtype=acc, device=grad_output.device)
    out = aten.index_put.default(out, [None, None, *index], aten._to_copy.default(grad_output, dtype=acc), True)
    return aten._to_copy.default(out, dtype=grad_output.dtype)


def _nearest_backward_fill(op, dims, exact):
    names = ["scales"] if dims == 1 else ["scales_d", "scales_h", "scales_w"][3 - dims :]

    def backward(grad_output, output_size, input_size, *scales, **kw):
        given = list(scales) + [kw.get(n) for n in names[len(scales) :]]
        return _upsample_nearest_backward(grad_output, output_size, input_size, given, exact)

    project_decomposition(op)(backward)


for _dims in (1, 2, 3):
    _nearest_backward_fill(getattr(aten, f"upsample_nearest{_dims}d_backward").default, _dims, exact=False)
    _nearest_backward_fill(getattr(aten, f"_upsample_nearest_exact{_dims}d_backward").default, _dims, exact=True)


# NOTE: the max-pooling backwards with saved indices (adaptive 2d/3d, max_pool3d) have no
# decomposition in PyTorch. Each output gradient goes to the input element its index names
# (flat within each channel's spatial plane), accumulated where windows overlap: scatter_add
# (core) over the flattened spatial dims. Channels-last inputs keep their layout (the trace
# restrides to eager's). Accumulation order may differ from the kernel's: agrees to rounding.
def _indexed_pool_backward(grad_output, self, indices, spatial):
    lead = list(self.shape[: self.dim() - spatial])
    acc = opmath(grad_output.dtype)
    flat_in = [*lead, -1] if lead else [-1]
    grad = aten.reshape.default(cast(grad_output, acc), flat_in)
    index = aten.reshape.default(indices, flat_in)
    zeros = aten.full.default([*lead, _numel(self.shape[self.dim() - spatial :])], 0, dtype=acc, device=self.device)
    out = aten.scatter_add.default(zeros, len(lead), index, grad)
    return cast(aten.view.default(out, list(self.shape)), grad_output.dtype)


def _numel(shape):
    return functools.reduce(lambda a, b: a * b, shape, 1)


@project_decomposition(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _indexed_pool_backward(grad_output, self, indices, 2)


@project_decomposition(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _indexed_pool_backward(grad_output, self, indices, 3)


@project_decomposition(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _indexed_pool_backward(grad_output, self, indices, 3)


# NOTE: replication padding copies border elements outwards; its backward (no decomposition in
# PyTorch) sends each output gradient to the input element it was copied from: the output
# position minus the left pad, clamped into the input, per padded dim (index_put accumulate).
def _replication_pad_backward(grad_output, self, padding):
    dims = len(padding) // 2
    acc = opmath(grad_output.dtype)
    index = []
    for k in range(dims):  # padding lists the last dim first: (left, right, top, bottom, ...)
        d = self.dim() - 1 - k
        left = padding[2 * k]
        src = aten.clamp.default(
            aten.sub.Tensor(aten.arange.default(grad_output.shape[d], device=self.device), left), 0, self.shape[d] - 1
        )
        index.insert(0, aten.view.default(src, [grad_output.shape[d]] + [1] * k))
    lead = [None] * (self.dim() - dims)
    out = aten.full.default(list(self.shape), 0, dtype=acc, device=self.device)
    out = aten.index_put.default(out, [*lead, *index], cast(grad_output, acc), True)
    return cast(out, grad_output.dtype)


for _d in (1, 2, 3):
    project_decomposition(getattr(aten, f"replication_pad{_d}d_backward").default)(_replication_pad_backward)


# NOTE: masked_scatter takes source elements in order into the masked positions; its backward
# returns the gradient of those positions in that order, zero-padded to the source's size. How
# many positions are masked is a data value: the bypass path.
@project_decomposition(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad_output, mask, sizes):
    shape = list(torch.broadcast_shapes(grad_output.shape, mask.shape))
    taken = aten.index.Tensor(aten.expand.default(grad_output, shape), [aten.expand.default(mask, shape)])
    total = _numel(sizes)
    pad = aten.full.default([total - taken.shape[0]], 0, dtype=grad_output.dtype, device=grad_output.device)
    return aten.view.default(aten.cat.default([taken, pad]), list(sizes))


# NOTE: no decomposition in PyTorch. Both pass the gradient outside [-lambd, lambd].
def _shrink_backward(grad_out, self, lambd):
    inside = aten.logical_and.default(aten.ge.Scalar(self, -lambd), aten.le.Scalar(self, lambd))
    return aten.where.self(
        inside, aten.scalar_tensor.default(0, dtype=grad_out.dtype, device=grad_out.device), grad_out
    )


@project_decomposition(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    return _shrink_backward(grad_out, self, lambd)


@project_decomposition(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return _shrink_backward(grad_output, self, lambd)


# -- average pooling backwards, 3-D: separable window matrices -----------------------------------
# NOTE: 3-D average pooling is separable: output (d, h, w) averages the box of the windows of
# d, h and w, and its divisor (count_include_pad or not, clipped to the padded or the real
# input) is the product of the per-dim window sizes. So the forward is
# out = A_D (x) A_H (x) A_W applied to the input, each A an [out, in] matrix of 1/size over
# its window, and the backward is its transpose: one einsum (bmm: core ops) of grad_output
# with the three matrices. divisor_override replaces the product by one constant.


def _window(n_out, n_in, lo, hi, size, dtype, device):
    """[n_out, n_in]: 1/size[i] (or 1, size None) where lo[i] <= j < hi[i]; lo/hi/size are
    functions of the output positions i (an int64 [n_out, 1] tensor)."""
    i = aten.unsqueeze.default(aten.arange.default(n_out, device=device), 1)
    j = aten.unsqueeze.default(aten.arange.default(n_in, device=device), 0)
    inside = aten.logical_and.default(aten.ge.Tensor(j, lo(i)), aten.lt.Tensor(j, hi(i)))
    weight = aten._to_copy.default(inside, dtype=dtype)
    return weight if size is None else aten.div.Tensor(weight, aten._to_copy.default(size(i), dtype=dtype))


def _apply_windows(grad_output, self, mats):
    acc = opmath(self.dtype)
    grad = torch.einsum("...dhw,dD,hH,wW->...DHW", cast(grad_output, acc), *mats)
    grad = cast(grad, self.dtype)
    fmt = (
        torch.channels_last_3d
        if self.dim() == 5 and self.is_contiguous(memory_format=torch.channels_last_3d) and not self.is_contiguous()
        else torch.contiguous_format
    )
    return aten.clone.default(grad, memory_format=fmt)


def _floordiv(a, b):
    return aten.div.Tensor_mode(a, b, rounding_mode="floor")


@project_decomposition(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    # the window of output i over n_in: [floor(i n_in / n_out), ceil((i + 1) n_in / n_out))
    acc = opmath(self.dtype)
    mats = []
    for n_out, n_in in zip(grad_output.shape[-3:], self.shape[-3:]):
        lo = lambda i, n_in=n_in, n_out=n_out: _floordiv(aten.mul.Tensor(i, n_in), n_out)  # noqa: E731
        hi = lambda i, n_in=n_in, n_out=n_out: _floordiv(
            aten.add.Tensor(aten.mul.Tensor(aten.add.Tensor(i, 1), n_in), n_out - 1), n_out
        )  # noqa: E731
        mats.append(
            _window(n_out, n_in, lo, hi, lambda i, lo=lo, hi=hi: aten.sub.Tensor(hi(i), lo(i)), acc, self.device)
        )
    return _apply_windows(grad_output, self, mats)


@project_decomposition(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None
):
    kernel_size = list(kernel_size) * (3 if len(kernel_size) == 1 else 1)
    stride = (list(stride) * (3 if len(stride) == 1 else 1)) if stride else kernel_size
    padding = list(padding) * (3 if len(padding) == 1 else 1)
    acc = opmath(self.dtype)
    mats = []
    for n_out, n_in, k, s, p in zip(grad_output.shape[-3:], self.shape[-3:], kernel_size, stride, padding):
        start = lambda i, s=s, p=p: aten.sub.Tensor(aten.mul.Tensor(i, s), p)  # noqa: E731
        end = lambda i, start=start, k=k, n_in=n_in, p=p: aten.clamp.default(
            aten.add.Tensor(start(i), k), None, n_in + p
        )  # noqa: E731
        lo = lambda i, start=start: aten.clamp.default(start(i), 0)  # noqa: E731
        hi = lambda i, end=end, n_in=n_in: aten.clamp.default(end(i), None, n_in)  # noqa: E731
        if divisor_override:
            size = None
        elif count_include_pad:
            size = lambda i, start=start, end=end: aten.sub.Tensor(end(i), start(i))  # noqa: E731
        else:
            size = lambda i, lo=lo, hi=hi: aten.sub.Tensor(hi(i), lo(i))  # noqa: E731
        mats.append(_window(n_out, n_in, lo, hi, size, acc, self.device))
    grad = _apply_windows(grad_output, self, mats)
    return aten.div.Tensor(grad, divisor_override) if divisor_override else grad


# -- distances: the gradient of ||a - b||_p with respect to a, per pair ----------------------------
# NOTE: cdist/pdist backwards have no decomposition. Each pair's term is the kernel's, by p:
# 0: none; 1: sign(diff); < 2: sign(diff) |diff|^(p-1) / dist^(p-1), 0 where dist == 0 or
# (p < 1 and diff == 0); 2: diff / dist, 0 where dist == 0; > 2: diff |diff|^(p-2) / dist^(p-1),
# 0 where dist == 0; inf: sign(diff) where |diff| == dist; each times the pair's grad, summed
# over the partners. Evaluated on all pairs at once ([..., P, R, M] differences).


def _distance_grad(diff, dist, grad, p):
    """diff [..., P, R, M], dist/grad [..., P, R, 1] -> the per-pair terms [..., P, R, M]."""
    zero = aten.zeros_like.default(diff)
    if p == 0:
        return zero
    if p == 1:
        return aten.mul.Tensor(aten.sign.default(diff), grad)
    if p == math.inf:
        hit = aten.eq.Tensor(aten.abs.default(diff), dist)
        return aten.where.self(hit, aten.mul.Tensor(aten.sign.default(diff), grad), zero)
    nil = aten.eq.Scalar(dist, 0.0)
    if p == 2:
        out = aten.div.Tensor(aten.mul.Tensor(diff, grad), dist)
    elif p < 2:
        out = aten.div.Tensor(
            aten.mul.Tensor(
                aten.mul.Tensor(aten.sign.default(diff), aten.pow.Tensor_Scalar(aten.abs.default(diff), p - 1)), grad
            ),
            aten.pow.Tensor_Scalar(dist, p - 1),
        )
        if p < 1:
            nil = aten.logical_or.default(nil, aten.eq.Scalar(diff, 0.0))
    else:
        out = aten.div.Tensor(
            aten.mul.Tensor(aten.mul.Tensor(diff, aten.pow.Tensor_Scalar(aten.abs.default(diff), p - 2)), grad),
            aten.pow.Tensor_Scalar(dist, p - 1),
        )
    return aten.where.self(nil, zero, out)


@project_decomposition(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    if not x1.dtype.is_floating_point or x1.dim() < 2 or x2.shape[-1] != x1.shape[-1]:
        return NotImplemented
    if x1.numel() == 0 or x2.numel() == 0 or grad.numel() == 0:  # the kernel's early return
        return aten.zeros_like.default(x1, memory_format=torch.contiguous_format)
    # batch dims broadcast: the kernel's gradient has the broadcast batch shape (autograd sums it to x1's)
    batch = list(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    x1 = aten.expand.default(x1, batch + list(x1.shape[-2:]))
    x2 = aten.expand.default(x2, batch + list(x2.shape[-2:]))
    diff = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))  # [..., P, R, M]
    terms = _distance_grad(diff, aten.unsqueeze.default(cdist, -1), aten.unsqueeze.default(grad, -1), float(p))
    return aten.clone.default(aten.sum.dim_IntList(terms, [-2]), memory_format=torch.contiguous_format)


@project_decomposition(aten._pdist_backward.default)
def pdist_backward(grad, self, p, pdist):
    if not self.dtype.is_floating_point or self.dim() != 2:
        return NotImplemented
    n = self.shape[0]
    if n <= 1 or self.shape[1] == 0:
        return aten.zeros_like.default(self, memory_format=torch.contiguous_format)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]  # pdist's condensed order
    rows = torch.tensor([i for i, _ in pairs] + [j for _, j in pairs], dtype=torch.int64, device=self.device)
    cols = torch.tensor([j for _, j in pairs] + [i for i, _ in pairs], dtype=torch.int64, device=self.device)

    def square(v):  # condensed [n(n-1)/2] -> symmetric [n, n, 1], diagonal 0
        full = aten.full.default([n, n], 0, dtype=v.dtype, device=v.device)
        return aten.unsqueeze.default(aten.index_put.default(full, [rows, cols], aten.cat.default([v, v])), -1)

    diff = aten.sub.Tensor(aten.unsqueeze.default(self, 1), aten.unsqueeze.default(self, 0))  # [n, n, M]
    terms = _distance_grad(diff, square(pdist), square(grad), float(p))
    return aten.sum.dim_IntList(terms, [1])
