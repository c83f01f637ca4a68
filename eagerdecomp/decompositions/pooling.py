"""Adaptive max pooling's general case (output sizes that do not divide the input's), and
max_unpool2d with eager's layout.

NOTE: PyTorch's decompositions cover global pooling and evenly dividing sizes and decline
the rest; its global case (argmax) also takes the first NaN where the kernel takes the last.
So every non-empty case is done here. Output i of a spatial dim pools [floor(i In / Out), ceil((i + 1) In / Out)); the
windows differ in length, so each is gathered at the longest length with a validity mask.
The CPU kernel scans a window in increasing flat input index keeping (value, index) and
takes an element when it is NaN or greater than the running value (which starts at -inf, at
the window's first index): the first maximum wins ties, the last NaN wins over everything.
The same rule is applied to the gathered windows with masked min/max over positions; values
are selected, never computed: exact.
"""

from __future__ import annotations

import torch
from torch._decomp import decompositions as torch_decomps

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


def _windows(n_in, n_out, device):
    """[n_out, K] input positions of each output's window (clamped) and their validity."""
    starts = [(i * n_in) // n_out for i in range(n_out)]
    ends = [-((-(i + 1) * n_in) // n_out) for i in range(n_out)]
    k = max(e - s for s, e in zip(starts, ends))
    i = aten.unsqueeze.default(aten.arange.default(n_out, device=device), 1)
    t = aten.unsqueeze.default(aten.arange.default(k, device=device), 0)
    start = aten.div.Tensor_mode(aten.mul.Tensor(i, n_in), n_out, rounding_mode="floor")
    end = aten.neg.default(
        aten.div.Tensor_mode(aten.mul.Tensor(aten.add.Tensor(i, 1), -n_in), n_out, rounding_mode="floor")
    )
    pos = aten.add.Tensor(start, t)
    return aten.clamp.default(pos, None, n_in - 1), aten.lt.Tensor(pos, end), k


def _adaptive_max(self, output_size, nd):
    spatial = list(self.shape[-nd:])
    lead = list(self.shape[:-nd])
    values, valid, flat = self, None, None
    mats = []
    for n_in, n_out in zip(spatial, output_size):
        pos, ok, k = _windows(n_in, n_out, self.device)
        mats.append((pos, ok, k, n_out))
    # gather every spatial dim's windows: [..., O1, K1, O2, K2, ...]
    for d, (pos, _ok, k, n_out) in enumerate(mats):
        axis = len(lead) + 2 * d
        values = aten.index_select.default(values, axis, aten.reshape.default(pos, [-1]))
        shape = list(values.shape)
        values = aten.view.default(values, shape[:axis] + [n_out, k] + shape[axis + 1 :])
    # validity and flat input index over [O1, K1, O2, K2, ...], broadcast against the values
    for d, (pos, ok, k, n_out) in enumerate(mats):
        shape = [1] * (2 * nd)
        shape[2 * d], shape[2 * d + 1] = n_out, k
        v = aten.view.default(ok, shape)
        stride = 1
        for n in spatial[d + 1 :]:
            stride *= n
        f = aten.view.default(aten.mul.Tensor(pos, stride), shape)
        valid = v if valid is None else aten.logical_and.default(valid, v)
        flat = f if flat is None else aten.add.Tensor(flat, f)
    # to [..., O1, O2, ..., K1 K2 ...]: the window's scan order is increasing flat index
    n = len(lead)
    order = list(range(n)) + [n + 2 * d for d in range(nd)] + [n + 2 * d + 1 for d in range(nd)]
    ks = 1
    for _, _, k, _ in mats:
        ks *= k
    outs = list(output_size)
    values = aten.reshape.default(aten.permute.default(values, order), lead + outs + [ks])
    local = [2 * d for d in range(nd)] + [2 * d + 1 for d in range(nd)]
    valid = aten.reshape.default(aten.permute.default(valid, local), outs + [ks])
    flat = aten.reshape.default(aten.permute.default(flat, local), outs + [ks])
    t = aten.arange.default(ks, device=self.device)
    nan = aten.logical_and.default(aten.isnan.default(values), valid)
    plain = aten.logical_and.default(valid, aten.logical_not.default(nan))
    clean = aten.where.self(plain, values, aten.full_like.default(values, -float("inf")))
    top = aten.amax.default(clean, [-1], True)
    best = aten.logical_and.default(plain, aten.eq.Tensor(values, top))
    first = aten.amin.default(aten.where.self(best, t, aten.full_like.default(t, ks)), [-1], True)
    first = aten.where.self(aten.eq.Scalar(first, ks), aten.zeros_like.default(first), first)  # all -inf: the first
    last_nan = aten.amax.default(aten.where.self(nan, t, aten.full_like.default(t, -1)), [-1], True)
    pick = aten.where.self(aten.ge.Scalar(last_nan, 0), last_nan, first)
    out = aten.squeeze.dim(aten.gather.default(values, -1, pick), -1)
    index = aten.squeeze.dim(aten.gather.default(aten.expand.default(flat, list(values.shape)), -1, pick), -1)
    # the 2-d kernel keeps a channels-last input's layout; the 3-d one always returns contiguous
    fmt = torch.channels_last if self.dim() == 4 else None
    if fmt is not None and self.is_contiguous(memory_format=fmt) and not self.is_contiguous():
        return aten.clone.default(out, memory_format=fmt), aten.clone.default(index, memory_format=fmt)
    return aten.clone.default(out, memory_format=torch.contiguous_format), aten.clone.default(
        index, memory_format=torch.contiguous_format
    )


def _adaptive(torch_fill, nd):
    def fill(self, output_size):
        if 0 in list(output_size) or not self.dtype.is_floating_point:
            return torch_fill(self, output_size)  # its argument checks and empty outputs
        if self.dim() not in (nd + 1, nd + 2) or 0 in self.shape[-nd:]:
            return torch_fill(self, output_size)
        return _adaptive_max(self, list(output_size), nd)

    return fill


def _declined(*args, **kwargs):
    return NotImplemented


# NOTE: torch's own decompositions (argument checks, empty outputs) arrived after 2.11; on an
# older torch those calls are declined (no path, a clear error) and the rest still decompose
project_decomposition(aten.adaptive_max_pool2d.default)(
    _adaptive(getattr(torch_decomps, "adaptive_max_pool2d", _declined), 2)
)
project_decomposition(aten.adaptive_max_pool3d.default)(
    _adaptive(getattr(torch_decomps, "adaptive_max_pool3d", _declined), 3)
)


def _torch_decomposition(op):
    from torch._decomp import decomposition_table

    return decomposition_table[op]


# NOTE: eager's max_unpool2d keeps a channels-last input channels-last; torch's decomposition
# returns a contiguous result (OpInfo samples 36+ at every float dtype: strides differ).
@project_decomposition(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
    out = _torch_decomposition(aten.max_unpool2d.default)(self, indices, output_size)
    if self.dim() == 4 and torch._prims_common.suggest_memory_format(self) == torch.channels_last:
        out = aten.clone.default(out, memory_format=torch.channels_last)
    return out


# NOTE: PyTorch has no decomposition of adaptive average pooling's backward (its forward has
# one), and core ATen keeps the op, so only opsets without it (prims_fusion) need this. Eager's
# kernel gives each output's share, grad / kh / kw, to every input of its window, outputs in
# row-major order; index_put with accumulate adds the shares in the order of its indices,
# (oh, kh, ow, kw), which is that same order for any one input.
@project_decomposition(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    if self.dim() not in (3, 4) or grad_output.dim() != self.dim() or not grad_output.dtype.is_floating_point:
        return NotImplemented  # eager's own checks and errors
    if 0 in self.shape or 0 in grad_output.shape:
        return NotImplemented
    (h, w), (oh, ow) = self.shape[-2:], grad_output.shape[-2:]
    lead = list(grad_output.shape[:-2])
    ph, okh, kh = _windows(h, oh, self.device)
    pw, okw, kw = _windows(w, ow, self.device)
    rows = aten.view.default(aten.sum.dim_IntList(okh, [1]), [oh, 1])  # window lengths
    cols = aten.view.default(aten.sum.dim_IntList(okw, [1]), [1, ow])
    delta = aten.div.Tensor(aten.div.Tensor(grad_output, rows), cols)
    shares = aten.view.default(delta, lead + [oh, 1, ow, 1])
    inside = aten.logical_and.default(aten.view.default(okh, [oh, kh, 1, 1]), aten.view.default(okw, [1, 1, ow, kw]))
    shares = aten.where.self(inside, shares, aten.scalar_tensor.default(0, dtype=delta.dtype, device=self.device))
    ih = aten.view.default(ph, [oh, kh, 1, 1])
    iw = aten.view.default(pw, [1, 1, ow, kw])
    grad_input = aten.zeros.default(list(self.shape), dtype=grad_output.dtype, device=self.device)
    grad_input = aten.index_put.default(grad_input, [None] * len(lead) + [ih, iw], shares, True)
    return aten.clone.default(grad_input, memory_format=torch._prims_common.suggest_memory_format(self))
