"""grid_sampler_2d_backward (spatial transformers, deformable sampling, optical flow warps).

NOTE: PyTorch decomposes grid_sampler_2d but not its backward. Each output location maps
its grid point (x, y) to input coordinates as the forward does: unnormalized by
(size - 1) / 2 (align_corners) or size / 2, then reflected and/or clipped by the padding
mode, each step with its derivative as the CPU kernel keeps it: a clipped coordinate (at or
past a border: the kernel counts borders as outside) has derivative 0, a reflection flips
the sign. Bilinear: the output gradient goes to the four corners with the forward's
weights (corners outside the input get nothing), and the grid gradient is the weights'
derivatives times the corner values, summed over channels. Nearest: the gradient goes to
the rounded location; the grid gets 0. Bicubic is declined. Sums run in another order
than the kernel's: the results agree to rounding.
"""

from __future__ import annotations

import torch

from .registry import project_decomposition

aten = torch.ops.aten
BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _clip(x, size):
    """Clip to [0, size - 1], derivative 1 strictly inside, else 0."""
    inside = aten.logical_and.default(aten.gt.Scalar(x, 0), aten.lt.Scalar(x, size - 1))
    return aten.clamp.default(x, 0, size - 1), aten._to_copy.default(inside, dtype=x.dtype)


def _reflect(x, twice_low, twice_high):
    """Reflect into [low, high] (the kernel's fmod form), derivative +-1."""
    if twice_low == twice_high:
        return aten.zeros_like.default(x), aten.zeros_like.default(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    shifted = aten.sub.Tensor(x, low)
    sign = aten.where.self(aten.lt.Scalar(shifted, 0), aten.full_like.default(x, -1.0), aten.full_like.default(x, 1.0))
    shifted = aten.abs.default(shifted)
    extra = aten.fmod.Scalar(shifted, span)
    odd = aten.eq.Scalar(aten.remainder.Scalar(aten.floor.default(aten.div.Tensor(shifted, span)), 2), 1)
    value = aten.add.Tensor(aten.where.self(odd, aten.rsub.Scalar(extra, span), extra), low)
    return value, aten.where.self(odd, aten.neg.default(sign), sign)


def _source(coord, size, padding, align_corners):
    """Input coordinates of a grid coordinate and d(coordinate)/d(grid)."""
    if align_corners:
        scale = (size - 1) / 2
        x = aten.mul.Tensor(aten.add.Tensor(coord, 1), scale)
    else:
        scale = size / 2
        x = aten.div.Tensor(aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(coord, 1), size), 1), 2)
    grad = aten.full_like.default(coord, scale)
    if padding == BORDER:
        x, g = _clip(x, size)
        grad = aten.mul.Tensor(grad, g)
    elif padding == REFLECTION:
        x, g = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        x, g2 = _clip(x, size)
        grad = aten.mul.Tensor(grad, aten.mul.Tensor(g, g2))
    return x, grad


def _corner(values, n, iy, ix, height, width):
    """values[n, iy, ix, :] where inside, else 0; and the inside mask, clamped indices."""
    inside = aten.logical_and.default(
        aten.logical_and.default(aten.ge.Scalar(ix, 0), aten.lt.Scalar(ix, width)),
        aten.logical_and.default(aten.ge.Scalar(iy, 0), aten.lt.Scalar(iy, height)))
    cy, cx = aten.clamp.default(iy, 0, height - 1), aten.clamp.default(ix, 0, width - 1)
    picked = aten.index.Tensor(values, [n, cy, cx])
    mask = aten.unsqueeze.default(inside, -1)
    return aten.where.self(mask, picked, aten.zeros_like.default(picked)), mask, cy, cx


@project_decomposition(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    if interpolation_mode not in (BILINEAR, NEAREST):
        return NotImplemented
    b, c, height, width = input.shape
    values = aten.permute.default(input, [0, 2, 3, 1])  # [N, H, W, C]
    g_out = aten.permute.default(grad_output, [0, 2, 3, 1])  # [N, Ho, Wo, C]
    ix, gx_mult = _source(aten.select.int(grid, 3, 0), width, padding_mode, align_corners)
    iy, gy_mult = _source(aten.select.int(grid, 3, 1), height, padding_mode, align_corners)
    n = aten.view.default(aten.arange.default(b, device=input.device), [b, 1, 1])
    grad_in = aten.full.default([b, height, width, c], 0, dtype=input.dtype, device=input.device)
    if interpolation_mode == NEAREST:
        rx = aten._to_copy.default(aten.round.default(ix), dtype=torch.int64)
        ry = aten._to_copy.default(aten.round.default(iy), dtype=torch.int64)
        _, mask, cy, cx = _corner(values, n, ry, rx, height, width)
        grad_in = aten.index_put.default(grad_in, [n, cy, cx], aten.where.self(mask, g_out, aten.zeros_like.default(g_out)), True)
        grad_grid = aten.zeros_like.default(grid, memory_format=torch.contiguous_format)
    else:
        x0, y0 = aten.floor.default(ix), aten.floor.default(iy)
        x1, y1 = aten.add.Tensor(x0, 1), aten.add.Tensor(y0, 1)
        dx1, dx0 = aten.sub.Tensor(x1, ix), aten.sub.Tensor(ix, x0)  # weight of the left / right column
        dy1, dy0 = aten.sub.Tensor(y1, iy), aten.sub.Tensor(iy, y0)
        i64 = lambda t: aten._to_copy.default(t, dtype=torch.int64)  # noqa: E731
        gx = gy = None
        # (corner y, corner x, weight, d weight / d x, d weight / d y)
        corners = ((y0, x0, aten.mul.Tensor(dx1, dy1), aten.neg.default(dy1), aten.neg.default(dx1)),
                   (y0, x1, aten.mul.Tensor(dx0, dy1), dy1, aten.neg.default(dx0)),
                   (y1, x0, aten.mul.Tensor(dx1, dy0), aten.neg.default(dy0), dx1),
                   (y1, x1, aten.mul.Tensor(dx0, dy0), dy0, dx0))
        for cy_f, cx_f, weight, dwx, dwy in corners:
            val, mask, cy, cx = _corner(values, n, i64(cy_f), i64(cx_f), height, width)
            if output_mask[0]:
                contrib = aten.mul.Tensor(g_out, aten.unsqueeze.default(weight, -1))
                grad_in = aten.index_put.default(grad_in, [n, cy, cx], aten.where.self(mask, contrib, aten.zeros_like.default(contrib)), True)
            dot = aten.sum.dim_IntList(aten.mul.Tensor(val, g_out), [-1])  # over channels
            tx, ty = aten.mul.Tensor(dot, dwx), aten.mul.Tensor(dot, dwy)
            gx = tx if gx is None else aten.add.Tensor(gx, tx)
            gy = ty if gy is None else aten.add.Tensor(gy, ty)
        grad_grid = aten.stack.default([aten.mul.Tensor(gx, gx_mult), aten.mul.Tensor(gy, gy_mult)], -1)
    grad_input = aten.clone.default(aten.permute.default(grad_in, [0, 3, 1, 2]), memory_format=torch.contiguous_format)
    return (grad_input if output_mask[0] else None), grad_grid
