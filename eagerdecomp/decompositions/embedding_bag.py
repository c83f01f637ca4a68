"""EmbeddingBag (recommendation models, bag-of-words encoders) beyond the core forward.

Core ATen keeps ``_embedding_bag``; its forward-only twin, the backward and the dense and
per-sample-weight gradients have no decomposition in PyTorch. Each decomposition follows the CPU
kernel in ``aten/src/ATen/native/EmbeddingBag.cpp``. The gradients add in another order
than the kernel's loops: they agree to rounding.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.numerics import cast, opmath
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
SUM, MEAN, MAX = 0, 1, 2


# NOTE: _embedding_bag_forward_only is _embedding_bag without the bookkeeping the backward
# needs, with the same outputs but with include_last_offset: there the CPU kernel's bag_size
# (and, in sum mode, max_indices) and the meta kernel's (the runtime's reference for every
# call) differ in length by one. No answer satisfies both, so those calls are declined (a
# clear error, not a guess).
@project_decomposition(aten._embedding_bag_forward_only.default)
def embedding_bag_forward_only(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    if include_last_offset:
        return NotImplemented
    return aten._embedding_bag.default(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx
    )


# NOTE: the CPU forward's fast sum path leaves offset2bag empty; the backward then rebuilds it
# as the kernel does (a mark at each offset, a running sum, minus 1). With include_last_offset
# the indices past the last offset then point one bag past the end, which the kernel reads
# out of bounds; here they go to the last bag, as the forward's own offset2bag (other paths)
# says.
def _offset2bag(indices, offsets, offset2bag, bags):
    """The bag of every index."""
    n = indices.shape[0]
    if n == 0 or offset2bag.shape[0] == n:
        return offset2bag
    ones = aten.full.default([offsets.shape[0]], 1, dtype=torch.int64, device=indices.device)
    marks = aten.full.default([n + 1], 0, dtype=torch.int64, device=indices.device)
    marks = aten.index_put.default(marks, [aten.clamp.default(offsets, None, n)], ones, True)
    bag = aten.sub.Tensor(aten.cumsum.default(aten.slice.Tensor(marks, 0, 0, n), 0), 1)
    return aten.clamp.default(bag, None, max(bags - 1, 0))


# NOTE: EmbeddingBag(mode="sum") with per_sample_weights: the gradient of each weight is the
# dot product of its bag's output gradient with the embedding row it scaled; padding_idx
# rows get 0. Eager refuses other modes.
@project_decomposition(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    if mode != SUM:
        raise RuntimeError("embedding_bag_backward: per_sample_weights only supported for mode='sum'")
    acc = opmath(grad.dtype)
    offset2bag = _offset2bag(indices, offsets, offset2bag, grad.shape[0])
    rows = aten.index.Tensor(cast(weight, acc), [indices])
    bags = aten.index.Tensor(cast(grad, acc), [offset2bag])
    out = aten.sum.dim_IntList(aten.mul.Tensor(rows, bags), [1])
    if padding_idx >= 0:
        zero = aten.scalar_tensor.default(0, dtype=acc, device=grad.device)
        out = aten.where.self(aten.eq.Scalar(indices, padding_idx), zero, out)
    return cast(out, grad.dtype)


@project_decomposition(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights=None,
    padding_idx=-1,
):
    if sparse:
        return NotImplemented  # a sparse gradient: outside Core ATen's strided tensors
    offset2bag = _offset2bag(indices, offsets, offset2bag, grad.shape[0])
    return aten._embedding_bag_dense_backward.default(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


# NOTE: the dense gradient. Max mode adds each bag's gradient at the rows its maxima came
# from (empty bags add nothing). Sum and mean add grad[bag] * scale at each index's row,
# skipping padding_idx, where scale (in double, then cast) is the per-sample weight, over the
# bag size in mean mode, and with scale_grad_by_freq over a count that the kernel looks up
# at the sorted indices' position g for the g-th distinct index (not at the index itself,
# as its name suggests); kept, so the gradient is eager's.
@project_decomposition(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights=None,
    padding_idx=-1,
):
    d = grad.shape[1]
    out = aten.full.default([num_weights, d], 0, dtype=grad.dtype, device=grad.device)
    if mode == MAX:
        keep = aten.unsqueeze.default(aten.ne.Scalar(bag_size, 0), 1)
        rows = aten.where.self(keep, maximum_indices, aten.zeros_like.default(maximum_indices))
        values = aten.where.self(keep, grad, aten.zeros_like.default(grad))
        cols = aten.expand.default(
            aten.unsqueeze.default(aten.arange.default(d, device=grad.device), 0), list(rows.shape)
        )
        return aten.index_put.default(out, [rows, cols], values, True)
    n = indices.shape[0]
    if n == 0:
        return out
    index = aten._to_copy.default(indices, dtype=torch.int64)
    scale = aten.full.default([n], 1.0, dtype=torch.float64, device=grad.device)
    if per_sample_weights is not None:
        scale = aten._to_copy.default(per_sample_weights, dtype=torch.float64)
    if scale_grad_by_freq:
        counts = aten.index_put.default(
            aten.full.default([num_weights], 0, dtype=torch.int64, device=grad.device),
            [index],
            aten.ones_like.default(index),
            True,
        )
        ordered = aten.sort.default(index)[0]
        starts = aten.cat.default(
            [
                aten.full.default([1], True, dtype=torch.bool, device=grad.device),
                aten.ne.Tensor(aten.slice.Tensor(ordered, 0, 1), aten.slice.Tensor(ordered, 0, 0, n - 1)),
            ]
        )
        rank = aten.sub.Tensor(aten.cumsum.default(starts, 0), 1)  # g for each sorted position
        per_value = aten.index_put.default(
            aten.full.default([num_weights], 1, dtype=torch.int64, device=grad.device),
            [ordered],
            aten.index.Tensor(counts, [aten.index.Tensor(ordered, [rank])]),
        )
        scale = aten.div.Tensor(
            scale, aten._to_copy.default(aten.index.Tensor(per_value, [index]), dtype=torch.float64)
        )
    if mode == MEAN:
        size = aten._to_copy.default(aten.index.Tensor(bag_size, [offset2bag]), dtype=torch.float64)
        scale = aten.where.self(aten.ne.Scalar(size, 0), aten.div.Tensor(scale, size), scale)
    rows = aten.mul.Tensor(aten.index.Tensor(grad, [offset2bag]), aten.unsqueeze.default(cast(scale, grad.dtype), 1))
    if padding_idx >= 0:
        rows = aten.where.self(
            aten.unsqueeze.default(aten.eq.Scalar(index, padding_idx), 1), aten.zeros_like.default(rows), rows
        )
    return aten.index_put.default(out, [index], rows, True)
