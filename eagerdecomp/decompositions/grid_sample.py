"""grid_sampler_3d and the 2-d and 3-d backwards (spatial transformers, deformable sampling, flow warps),
and eager's checks of grid_sampler_2d.

NOTE: PyTorch decomposes grid_sampler_2d but not the 3-d sampler or the backwards. Each
output location maps its grid point to input coordinates as the forward does: unnormalized by
(size - 1) / 2 (align_corners) or size / 2, then reflected and/or clipped by the padding
mode, each step with its derivative as the CPU kernel keeps it: a clipped coordinate (at or
past a border: the kernel counts borders as outside) has derivative 0, a reflection flips
the sign. Bilinear (trilinear in 3-d): the output gradient goes to the corners with the
forward's weights (corners outside the input get nothing), and the grid gradient is the weights'
derivatives times the corner values, summed over channels. Nearest: the gradient goes to
the rounded location; the grid gets 0. Bicubic is declined. Sums run in another order
than the kernel's: the results agree to rounding.
"""

from __future__ import annotations

import functools
import itertools

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.checks import checks_for

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


def _corner(values, n, idx, sizes):
    """values[n, *idx, :] where inside, else 0; the inside mask; the clamped indices."""
    inside = None
    for i, size in zip(idx, sizes):
        ok = aten.logical_and.default(aten.ge.Scalar(i, 0), aten.lt.Scalar(i, size))
        inside = ok if inside is None else aten.logical_and.default(inside, ok)
    clamped = [aten.clamp.default(i, 0, size - 1) for i, size in zip(idx, sizes)]
    picked = aten.index.Tensor(values, [n, *clamped])
    mask = aten.unsqueeze.default(inside, -1)
    return aten.where.self(mask, picked, aten.zeros_like.default(picked)), mask, clamped


def _setup(input, grid, padding_mode, align_corners):
    """Channels-last values, batch index, and per spatial dim (outermost first) the source
    coordinates and their derivatives; the grid's last dim lists x (innermost) first."""
    nd = input.dim() - 2
    sizes = list(input.shape[2:])
    values = aten.permute.default(input, [0, *range(2, nd + 2), 1])
    coords = [_source(aten.select.int(grid, -1, nd - 1 - d), sizes[d], padding_mode, align_corners) for d in range(nd)]
    n = aten.view.default(aten.arange.default(input.shape[0], device=input.device), [-1] + [1] * nd)
    return values, n, sizes, coords


def _corners(coords):
    """The 2**nd corners in the kernel's order (tnw, tne, ...): their index per dim, their
    weight, and the weight's derivative along each dim."""
    lo = [aten.floor.default(x) for x, _ in coords]
    near = [aten.sub.Tensor(aten.add.Tensor(f, 1), x) for f, (x, _) in zip(lo, coords)]  # weight of the low side
    far = [aten.sub.Tensor(x, f) for f, (x, _) in zip(lo, coords)]
    i64 = lambda t: aten._to_copy.default(t, dtype=torch.int64)  # noqa: E731
    for bits in itertools.product((0, 1), repeat=len(coords)):
        factors = [far[d] if b else near[d] for d, b in enumerate(bits)]
        weight = functools.reduce(aten.mul.Tensor, reversed(factors))  # x first, as the kernel multiplies
        slopes = []
        for d, b in enumerate(bits):
            rest = [factors[e] for e in range(len(bits)) if e != d]
            slope = functools.reduce(aten.mul.Tensor, reversed(rest)) if rest else aten.ones_like.default(weight)
            slopes.append(slope if b else aten.neg.default(slope))
        yield [i64(aten.add.Tensor(lo[d], b)) for d, b in enumerate(bits)], weight, slopes


def _rounded(coords):
    return [aten._to_copy.default(aten.round.default(x), dtype=torch.int64) for x, _ in coords]


# NOTE: grid_sampler_3d (volumetric spatial transformers, 3-d deformable registration) has no
# decomposition in PyTorch. Trilinear adds the eight corners in the kernel's order with the
# same products; nearest rounds half to even (nearbyint), as the kernel.
@project_decomposition(aten.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode not in (BILINEAR, NEAREST) or input.dim() != 5:
        return NotImplemented
    values, n, sizes, coords = _setup(input, grid, padding_mode, align_corners)
    if interpolation_mode == NEAREST:
        out, _, _ = _corner(values, n, _rounded(coords), sizes)
    else:
        out = None
        for idx, weight, _ in _corners(coords):
            val, _, _ = _corner(values, n, idx, sizes)
            term = aten.mul.Tensor(val, aten.unsqueeze.default(weight, -1))
            out = term if out is None else aten.add.Tensor(out, term)
    out = aten.permute.default(out, [0, 4, 1, 2, 3])
    return aten.clone.default(out, memory_format=torch.contiguous_format)


def _grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    if interpolation_mode not in (BILINEAR, NEAREST):
        return NotImplemented
    nd = input.dim() - 2
    values, n, sizes, coords = _setup(input, grid, padding_mode, align_corners)
    g_out = aten.permute.default(grad_output, [0, *range(2, nd + 2), 1])
    grad_in = aten.full.default([input.shape[0], *sizes, input.shape[1]], 0, dtype=input.dtype, device=input.device)
    if interpolation_mode == NEAREST:
        _, mask, idx = _corner(values, n, _rounded(coords), sizes)
        grad_in = aten.index_put.default(
            grad_in, [n, *idx], aten.where.self(mask, g_out, aten.zeros_like.default(g_out)), True
        )
        grad_grid = aten.zeros_like.default(grid, memory_format=torch.contiguous_format)
    else:
        grads = [None] * nd
        for idx, weight, slopes in _corners(coords):
            val, mask, clamped = _corner(values, n, idx, sizes)
            if output_mask[0]:
                contrib = aten.mul.Tensor(g_out, aten.unsqueeze.default(weight, -1))
                grad_in = aten.index_put.default(
                    grad_in, [n, *clamped], aten.where.self(mask, contrib, aten.zeros_like.default(contrib)), True
                )
            dot = aten.sum.dim_IntList(aten.mul.Tensor(val, g_out), [-1])  # over channels
            for d in range(nd):
                t = aten.mul.Tensor(dot, slopes[d])
                grads[d] = t if grads[d] is None else aten.add.Tensor(grads[d], t)
        per_dim = [aten.mul.Tensor(grads[d], coords[d][1]) for d in range(nd)]
        grad_grid = aten.stack.default(per_dim[::-1], -1)  # x first
    grad_input = aten.clone.default(
        aten.permute.default(grad_in, [0, nd + 1, *range(1, nd + 1)]), memory_format=torch.contiguous_format
    )
    return (grad_input if output_mask[0] else None), grad_grid


project_decomposition(aten.grid_sampler_2d_backward.default)(_grid_sampler_backward)
project_decomposition(aten.grid_sampler_3d_backward.default)(_grid_sampler_backward)


# NOTE: torch's grid_sampler_2d decomposition (the preset's path; core ATen keeps the op) unpacks
# a 4-d input unchecked, so a 5-d one raised ValueError, and it has no meta kernel of its own to
# refuse first: eager's two checks, in its order and words (sizes printed as ATen prints them).
@checks_for(aten.grid_sampler_2d)
def _grid_sampler_2d_checks(input, grid, *args, **kwargs):
    if input.device != grid.device:
        raise RuntimeError(
            "grid_sampler(): expected input and grid to be on same device, but input is on "
            f"{input.device} and grid is on {grid.device}"
        )
    sizes = f"input with sizes {list(input.shape)} and grid with sizes {list(grid.shape)}"
    if input.shape[0] != grid.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, but got {sizes}")
    if grid.shape[-1] != input.dim() - 2:
        raise RuntimeError(
            f"grid_sampler(): expected grid to have size {input.dim() - 2} in last dimension, "
            f"but got grid with sizes {list(grid.shape)}"
        )
    for i in range(2, input.dim()):
        if input.shape[i] <= 0:
            raise RuntimeError(
                "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes "
                f"{list(input.shape)} with dimension {i} being empty"
            )
    if input.dim() != 4 or grid.dim() != 4:
        raise RuntimeError(
            f"grid_sampler(): expected 4D input and grid with same number of dimensions, but got {sizes}"
        )
