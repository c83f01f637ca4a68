"""Fractional max pooling (2d and 3d), forward and backward, exactly as the CPU kernels.

NOTE: no decomposition in PyTorch. The kernel places each plane's windows with its random
samples: along a dim of In inputs, Out outputs and pool size K, alpha = (In - K) / (Out - 1)
and output i starts at int((i + u) * alpha) - int(u * alpha), the last at In - K, all in
the input's dtype (so a 16-bit input rounds at each step, as c10's 16-bit arithmetic does).
Width takes the plane's first sample, height the second (3d: time, height, width take the
first, second, third). Each window is scanned in increasing flat index keeping (value,
index) from (-inf, the window's first index), taking an element that is NaN or greater:
the first maximum wins ties, the last NaN wins over everything. Values are selected, never
computed: exact. The backward adds each gradient at its index (backward.py's rule).
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.backward import _indexed_pool_backward
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

# the sample each spatial dim takes, by the number of spatial dims
_SAMPLE = {2: (1, 0), 3: (0, 1, 2)}


def _starts(sample, n_in, n_out, pool):
    """[..., n_out] window starts (int64) from ``sample`` [...] in the input's dtype."""
    dtype, device = sample.dtype, sample.device
    last = aten.full.default(list(sample.shape) + [1], n_in - pool, dtype=torch.int64, device=device)
    if n_out == 1:
        return last
    alpha = aten.div.Tensor(
        aten.full.default([], n_in - pool, dtype=dtype, device=device),
        aten.full.default([], n_out - 1, dtype=dtype, device=device),
    )
    i = aten._to_copy.default(aten.arange.default(n_out - 1, device=device), dtype=dtype)
    u = aten.unsqueeze.default(sample, -1)
    at = aten._to_copy.default(aten.mul.Tensor(aten.add.Tensor(i, u), alpha), dtype=torch.int64)
    base = aten._to_copy.default(aten.mul.Tensor(u, alpha), dtype=torch.int64)
    return aten.cat.default([aten.sub.Tensor(at, base), last], -1)


def _fractional_max(self, kernel_size, output_size, random_samples, nd):
    batched = self.dim() == nd + 2
    x = self if batched else aten.unsqueeze.default(self, 0)
    samples = random_samples if batched or random_samples.dim() == 3 else aten.unsqueeze.default(random_samples, 0)
    b, c = x.shape[0], x.shape[1]
    spatial = list(x.shape[2:])
    device = x.device
    # index tensors broadcast over [B, C, O1, ..., Ond, K1, ..., Knd]
    rank = 2 + 2 * nd
    flat = None
    index = [
        aten.view.default(aten.arange.default(b, device=device), [b] + [1] * (rank - 1)),
        aten.view.default(aten.arange.default(c, device=device), [1, c] + [1] * (rank - 2)),
    ]
    for d in range(nd):
        start = _starts(aten.select.int(samples, 2, _SAMPLE[nd][d]), spatial[d], output_size[d], kernel_size[d])
        shape = [b, c] + [1] * (2 * nd)
        shape[2 + d] = output_size[d]
        k_shape = [1] * rank
        k_shape[2 + nd + d] = kernel_size[d]
        pos = aten.add.Tensor(
            aten.view.default(start, shape),
            aten.view.default(aten.arange.default(kernel_size[d], device=device), k_shape),
        )
        index.append(pos)
        stride = 1
        for n in spatial[d + 1 :]:
            stride *= n
        flat = aten.mul.Tensor(pos, stride) if flat is None else aten.add.Tensor(flat, aten.mul.Tensor(pos, stride))
    values = aten.index.Tensor(x, index)
    ks = 1
    for k in kernel_size:
        ks *= k
    outs = [b, c] + list(output_size)
    values = aten.reshape.default(values, outs + [ks])
    flat = aten.reshape.default(aten.expand.default(flat, outs + list(kernel_size)), outs + [ks])
    t = aten.arange.default(ks, device=device)
    nan = aten.isnan.default(values)
    plain = aten.logical_not.default(nan)
    clean = aten.where.self(plain, values, aten.full_like.default(values, -float("inf")))
    best = aten.logical_and.default(plain, aten.eq.Tensor(values, aten.amax.default(clean, [-1], True)))
    first = aten.amin.default(aten.where.self(best, t, aten.full_like.default(t, ks)), [-1], True)
    first = aten.where.self(aten.eq.Scalar(first, ks), aten.zeros_like.default(first), first)  # all -inf: the first
    last_nan = aten.amax.default(aten.where.self(nan, t, aten.full_like.default(t, -1)), [-1], True)
    pick = aten.where.self(aten.ge.Scalar(last_nan, 0), last_nan, first)
    out = aten.squeeze.dim(aten.gather.default(values, -1, pick), -1)
    idx = aten.squeeze.dim(aten.gather.default(flat, -1, pick), -1)
    if not batched:
        out, idx = aten.squeeze.dim(out, 0), aten.squeeze.dim(idx, 0)
    return out, idx


def _fill(nd):
    def fill(self, kernel_size, output_size, random_samples):
        if not self.dtype.is_floating_point or self.dim() not in (nd + 1, nd + 2):
            return NotImplemented
        return _fractional_max(self, list(kernel_size), list(output_size), random_samples, nd)

    return fill


project_decomposition(aten.fractional_max_pool2d.default)(_fill(2))
project_decomposition(aten.fractional_max_pool3d.default)(_fill(3))


@project_decomposition(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _indexed_pool_backward(grad_output, self, indices, 2)


@project_decomposition(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _indexed_pool_backward(grad_output, self, indices, 3)
