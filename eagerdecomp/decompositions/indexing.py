"""Indexing and tensor-creation ops models reach directly, with no path to the opset in PyTorch.

Found by replaying the aten calls of real training steps (PyTorch's benchmark operator logs).
Here: ``lift_fresh_copy``, index_put's private forms, ``index_reduce``, ``repeat_interleave``,
``embedding_renorm``, ``as_strided_scatter``, ``nonzero_static``, ``select.int``, ``view.dtype``,
``expand``, ``view`` and ``constant_pad_nd`` (for opsets without them: prims), ``masked_select``,
``put``, the legacy ``scatter(reduce=)``, and out= forms that lay out their result as eager does
(``ones``/``zeros``, ``cat``, ``nonzero``).
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.overlap import guard, storage_positions
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten


# NOTE: torch.tensor(...) under functionalization (and torch.compile's traced programs run
# eagerly) calls lift_fresh_copy; no decomposition in PyTorch. It is a plain copy.
@project_decomposition(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return aten.clone.default(self)


# NOTE: x[idx] = v dispatches here from the CompositeExplicitAutograd index_put_, and code
# copied from PyTorch internals calls it directly. `unsafe` only skips bounds checks in the
# native kernel; index_put (core) checks them, which is what eager does with unsafe=False.
# (Its hacked_twin overload exists for TorchScript only: the dispatcher has no entry for it.)
@project_decomposition(aten._index_put_impl_.default)
def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    return aten.index_put_.default(self, list(indices), values, accumulate)


@project_decomposition(aten._index_put_impl.default)
def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return aten.index_put.default(self, list(indices), values, accumulate)


# NOTE: torch.ones(size, out=t) / torch.zeros(size, out=t): no functional twin of this
# signature (ones.default takes dtype=, out= gives it), so the generic out= rule cannot reach
# them. The core full in out's dtype and device, written into out resized as eager resizes it.
def _filled_out(value):
    def fill_out(size, *, out):
        result = aten.full.default(list(size), value, dtype=out.dtype, device=out.device)
        resize_out(out, result.shape)
        return aten.copy_.default(out, result)

    return fill_out


project_decomposition(aten.ones.out)(_filled_out(1))
project_decomposition(aten.zeros.out)(_filled_out(0))


# NOTE: repeat_interleave(repeats) gives i repeats[i] times: output[j] counts the blocks that
# end at or before j. Each block's end (the cumsum of repeats) adds one at that position,
# accumulated (zero repeats stack at one position) and ends past the output dropped; the
# running sum is the answer. The length is a data value (or output_size): these calls
# decompose eagerly. Negative repeats raise the kernel's error.
@project_decomposition(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size=None):
    if repeats.dim() != 1 or repeats.dtype not in (torch.int32, torch.int64):
        return NotImplemented
    n = repeats.shape[0]
    ends = aten.cumsum.default(repeats, 0, dtype=torch.int64)
    if n and aten._local_scalar_dense.default(aten.lt.Scalar(aten.amin.default(repeats, []), 0)):
        raise RuntimeError("repeats can not be negative")
    total = int(aten._local_scalar_dense.default(aten.select.int(ends, 0, -1))) if n else 0
    if output_size is not None:
        if output_size != total:
            return NotImplemented  # eager's mismatch error, left to a path that raises it
    marks = aten.full.default([total], 0, dtype=torch.int64, device=repeats.device)
    if n > 1 and total > 0:
        starts = aten.slice.Tensor(ends, 0, 0, n - 1)
        inside = aten.lt.Scalar(starts, total)
        pos = aten.where.self(inside, starts, aten.zeros_like.default(starts))
        marks = aten.index_put.default(marks, [pos], aten._to_copy.default(inside, dtype=torch.int64), True)
    return aten._to_copy.default(aten.cumsum.default(marks, 0), dtype=repeats.dtype)


# NOTE: index_reduce(dim, index, source, reduce) reduces source's slice i into self's slice
# index[i]: scatter_reduce (core) with index broadcast along source's other dims; the reduce
# names (prod, mean, amax, amin) and include_self mean the same in both. index_reduce takes
# int32 indices too, scatter_reduce only int64.
@project_decomposition(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin") or index.dim() > 1:
        return NotImplemented
    if self.dim() == 0:  # a scalar is its own slice 0: reduce as a [1] tensor
        if source.dim() != 0 or dim not in (0, -1):
            return NotImplemented
        one = index_reduce(
            aten.view.default(self, [1]), 0, index, aten.view.default(source, [1]), reduce, include_self=include_self
        )
        return aten.view.default(one, [])
    dim = dim % self.dim()
    if index.dtype != torch.int64:
        index = aten._to_copy.default(index, dtype=torch.int64)
    if reduce in ("prod", "mean") and self.dtype in (torch.float16, torch.bfloat16):
        return _index_reduce_in_order(self, dim, index, source, reduce, include_self)
    shape = [1] * source.dim()
    shape[dim] = index.numel()
    full = aten.expand.default(aten.view.default(index, shape), list(source.shape))
    return aten.scatter_reduce.two(self, dim, full, source, reduce, include_self=include_self)


def _index_reduce_in_order(self, dim, index, source, reduce, include_self):
    # NOTE: eager reduces source's slices into self one index entry at a time, rounding to
    # the half type after each; scatter_reduce accumulates in float and rounds once. Sums in
    # index order are index_put's accumulate; products are one step per entry.
    out = aten.movedim.int(self, dim, 0)
    src = aten.movedim.int(source, dim, 0)
    if not include_self:
        out = aten.index_fill.int_Scalar(out, 0, index, 1 if reduce == "prod" else 0)
    if reduce == "prod":
        for i in range(index.numel()):
            at = aten.slice.Tensor(index, 0, i, i + 1)
            step = aten.mul.Tensor(aten.index_select.default(out, 0, at), aten.slice.Tensor(src, 0, i, i + 1))
            out = aten.index_put.default(out, [at], step)
        return aten.movedim.int(out, 0, dim)
    out = aten.index_put.default(out, [index], src, True)
    counts = aten.full.default([self.shape[dim]], 1 if include_self else 0, dtype=self.dtype, device=self.device)
    counts = aten.index_put.default(counts, [index], aten.ones_like.default(index, dtype=self.dtype), True)
    counts = aten.masked_fill.Scalar(counts, aten.eq.Scalar(counts, 0), 1)
    out = aten.div.Tensor(out, aten.view.default(counts, [-1] + [1] * (self.dim() - 1)))
    return aten.movedim.int(out, 0, dim)


# NOTE: F.embedding(max_norm=) renormalizes, in place, the weight rows its indices name: a
# row whose p-norm exceeds max_norm is scaled by max_norm / (norm + 1e-7), the scale formed
# in double from the row's norm, as the kernel does, then applied in the weight's dtype. A
# row named twice is scaled once: every copy of it writes the same scaled row.
@project_decomposition(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    if self.dim() != 2 or not self.dtype.is_floating_point:
        return NotImplemented
    index = aten.reshape.default(indices, [-1])
    rows = aten.index_select.default(self, 0, index)
    norm = aten._to_copy.default(aten.linalg_vector_norm.default(rows, norm_type, [1], True), dtype=torch.float64)
    scale = aten.div.Tensor(aten.full_like.default(norm, max_norm), aten.add.Tensor(norm, 1e-7))
    scaled = aten.mul.Tensor(rows, aten._to_copy.default(scale, dtype=self.dtype))
    rows = aten.where.self(aten.gt.Scalar(norm, max_norm), scaled, rows)
    return aten.index_put.default(self, [index], rows)


def _dense_order(t):
    """True when ``t`` is dense and non-overlapping (its elements fill numel() storage slots)."""
    dims = sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=lambda d: t.stride(d))
    expected = 1
    for d in dims:
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _overlaps(size, stride) -> bool:
    """Whether two index tuples of a view of ``size`` and ``stride`` reach one position."""
    extent = 1
    for d in sorted((d for d in range(len(size)) if size[d] != 1), key=lambda d: stride[d]):
        if stride[d] < extent:
            return True
        extent = stride[d] * (size[d] - 1) + 1
    return False


# NOTE: as_strided_scatter(self, src, size, stride, offset) is eager's clone of self's whole
# storage, seen as self (its strides and storage offset), with src copied into
# clone.as_strided(size, stride, offset): positions in that storage, counted from its start
# (a self that overlaps itself is cloned plainly, dense, first). Here: a flat storage just
# long enough for self, holding self's values at their positions (a dense self at offset 0:
# its clone), src written at offset + sum_d i_d stride_d (index_put), and the result that
# storage seen as self. Exact in values, strides and offset; only the result's storage is no
# longer than self needs. Declined: a view that overlaps itself (eager's copy_ refuses it)
# or reaches past what self spans, a src of another shape.
@project_decomposition(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    offset = storage_offset or 0
    size, stride = list(size), list(stride)
    if list(src.shape) != size or len(stride) != len(size) or self.numel() == 0 or _overlaps(size, stride):
        return NotImplemented
    if _overlaps(list(self.shape), list(self.stride())):
        self = aten.clone.default(self, memory_format=torch._prims_common.suggest_memory_format(self))
    start = self.storage_offset()
    m = start + 1 + sum((n - 1) * st for n, st in zip(self.shape, self.stride()))
    if 0 not in size and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= m:
        return NotImplemented
    if start == 0 and _dense_order(self):
        storage = aten.as_strided.default(aten.clone.default(self), [m], [1], 0)
    else:
        fresh = aten.empty.memory_format([m], dtype=self.dtype, device=self.device)
        where = aten.reshape.default(storage_positions(list(self.shape), list(self.stride()), start, self.device), [-1])
        storage = aten.index_put.default(fresh, [where], aten.reshape.default(self, [-1]))
    if 0 not in size:
        values = aten.reshape.default(aten._to_copy.default(src, dtype=self.dtype), [-1])
        storage = aten.index_put.default(
            storage, [aten.reshape.default(storage_positions(size, stride, offset, self.device), [-1])], values
        )
    else:
        storage = aten.clone.default(storage)  # (a fresh result even when nothing is written)
    return aten.as_strided.default(storage, list(self.shape), list(self.stride()), start)


# NOTE: nonzero_static(size, fill_value) is nonzero's [n, ndim] indices cut to `size` rows or
# padded with fill_value rows: the core nonzero (a data-dependent shape: these calls decompose
# eagerly), then a slice or a cat. Exact.
@project_decomposition(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    found = aten.nonzero.default(self)
    n, ndim = found.shape
    if n >= size:
        return aten.clone.default(aten.slice.Tensor(found, 0, 0, size), memory_format=torch.contiguous_format)
    pad = aten.full.default([size - n, ndim], fill_value, dtype=torch.int64, device=self.device)
    return aten.cat.default([found, pad])


# NOTE: core ATen keeps select.int, so this only serves opsets without it (prims):
# PyTorch has neither a decomposition nor a ref for it.
@project_decomposition(aten.select.int)
def select_int(self, dim, index):
    dim = dim % self.dim()
    size = self.shape[dim]
    if not -size <= index < size:
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {list(self.shape)} at dimension {dim}"
        )
    index = index % size
    sizes = [n for d, n in enumerate(self.shape) if d != dim]
    strides = [st for d, st in enumerate(self.stride()) if d != dim]
    offset = self.storage_offset() + index * self.stride(dim)
    if not sizes:
        # NOTE: prims.as_strided's meta multiplies the sizes with reduce() and no start value, so
        # a 0-dim view (x[0] of a vector: batch_sizes[0] in nn.GRU's packed path) raises TypeError;
        # a one-element view squeezed is the same view
        one = torch.ops.prims.as_strided.default(self, [1], [1], offset)
        return torch.ops.prims.squeeze.default(one, [0])
    return torch.ops.prims.as_strided.default(self, sizes, strides, offset)


# NOTE: core ATen keeps view.dtype; for prims opsets torch's ref `view`, registered for every
# overload of view, read the dtype as a shape ("'>=' not supported between torch.dtype and int").
# prims.view_of_dtype is the same view (its meta is view.dtype itself: eager's checks and errors).
@project_decomposition(aten.view.dtype)
def view_dtype(self, dtype):
    return torch.ops.prims.view_of_dtype.default(self, dtype)


# NOTE: core ATen keeps expand and view; for prims opsets torch's refs check what eager's kernels
# check but say it otherwise: expand's mismatch in other words, view's incompatible strides as a
# ValueError where eager raises RuntimeError. Eager's errors (ATen's infer_expand_geometry and
# view), then the refs.
@project_decomposition(aten.expand.default)
def expand(self, size, *, implicit=False):
    sizes, have = list(size), list(self.shape)
    torch._check(
        len(sizes) >= len(have),
        lambda: (
            f"expand({self.type()}{{{have}}}, size={sizes}): the number of sizes provided ({len(sizes)}) "
            f"must be greater or equal to the number of dimensions in the tensor ({len(have)})"
        ),
    )
    for i in reversed(range(len(sizes))):
        dim = i - len(sizes) + len(have)
        existing, target = (have[dim] if dim >= 0 else 1), sizes[i]
        if target == -1:
            torch._check(
                dim >= 0,
                lambda: (
                    f"The expanded size of the tensor ({target}) isn't allowed in a leading, non-existing dimension {i}"
                ),
            )
            target = existing
        torch._check(
            existing == target or existing == 1,
            lambda: (
                f"The expanded size of the tensor ({target}) must match the existing size ({existing}) at "
                f"non-singleton dimension {i}.  Target sizes: {sizes}.  Tensor sizes: {have}"
            ),
        )
    return torch._refs.expand(self, sizes)


@project_decomposition(aten.view.default)
def view(self, size):
    try:
        return torch._refs.view(self, size)
    except ValueError:  # (the ref's "Cannot view a tensor with shape ..."; its other checks are RuntimeErrors)
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension spans "
            "across two contiguous subspaces). Use .reshape(...) instead."
        ) from None


# C's names in eager's message for a fill value an integer dtype cannot hold (c10's checked_convert)
_C_INT_NAMES = {
    torch.uint8: "uint8_t",
    torch.int8: "int8_t",
    torch.int16: "int16_t",
    torch.int32: "int",
    torch.int64: "int64_t",
}


# NOTE: core ATen keeps constant_pad_nd; for prims opsets torch's ref fills with the value as
# given, and refuses a float for an integer tensor ("cannot be safely cast"): F.pad passes its
# value as a float, so F.pad(labels, (0, 1), value=-100) (transformers' causal-LM loss) failed.
# Eager converts the value to the dtype as C++ does: truncated, checked for overflow.
@project_decomposition(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    if isinstance(value, float) and self.dtype == torch.bool:
        value = bool(value)
    elif isinstance(value, float) and self.dtype in _C_INT_NAMES:
        info = torch.iinfo(self.dtype)
        torch._check(
            info.min <= value <= info.max,  # (False for NaN)
            lambda: f"value cannot be converted to type {_C_INT_NAMES[self.dtype]} without overflow",
        )
        value = int(value)  # toward zero, as C++'s conversion
    return torch._refs.constant_pad_nd(self, pad, value)


# NOTE: no decomposition in PyTorch. Indexing with a boolean mask is core
# (index.Tensor) and selects exactly the masked elements in row-major order.
@project_decomposition(aten.masked_select.default)
def masked_select(self, mask):
    shape = list(torch.broadcast_shapes(self.shape, mask.shape)) or [1]  # a 0-dim pair selects as 1-D
    return aten.index.Tensor(aten.expand.default(self, shape), [aten.expand.default(mask, shape)])


# NOTE: no decomposition in PyTorch. put indexes self as if it were 1-D: index_put
# (core) on the flattened tensor is the same, negative indices and accumulate included.
@project_decomposition(aten.put.default)
def put(self, index, source, accumulate=False):
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    out = aten.index_put.default(flat, [aten.view.default(index, [-1])], aten.view.default(source, [-1]), accumulate)
    return aten.view.default(out, list(self.shape))


# NOTE: the legacy scatter(reduce="add"|"multiply") is scatter_reduce (core) including self.
_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


@project_decomposition(aten.scatter.reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    if reduce not in _SCATTER_REDUCE:
        return NotImplemented
    return aten.scatter_reduce.two(self, dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)


# NOTE: ... and its scalar form scatters value (in self's dtype) the same way.
@project_decomposition(aten.scatter.value_reduce)
def scatter_value_reduce_legacy(self, dim, index, value, *, reduce):
    if reduce not in _SCATTER_REDUCE:
        return NotImplemented
    src = aten.full.default(list(index.shape), value, dtype=self.dtype, device=self.device)
    return aten.scatter_reduce.two(self, dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)


# NOTE: cat is structured: an out= it resizes takes the strides eager's functional cat picks
# (channels-last inputs give a channels-last out); the generic out rule resizes contiguous.
@project_decomposition(aten.cat.out)
def cat_out(tensors, dim=0, *, out):
    guard(aten.cat.out, aten.cat.default, out, [tensors])
    result = aten.cat.default(tensors, dim)
    if out.shape != result.shape:
        resize_out(out, result.shape)
        if torch._prims_common.is_non_overlapping_and_dense_or_false(result):
            aten.as_strided_.default(out, result.shape, result.stride(), out.storage_offset())
    return aten.copy_.default(out, result)


# NOTE: eager's nonzero(out=) hands back a column-major (n, ndim) out, the transpose of an
# (ndim, n) buffer, unless the out it got already has that shape (then it keeps its strides).
@project_decomposition(aten.nonzero.out)
def nonzero_out(self, *, out):
    result = aten.nonzero.default(self)
    n, ndim = result.shape
    if out.shape != result.shape:
        resize_out(out, (n, ndim))  # (the shape eager's resize warning names; the same storage size)
        aten.as_strided_.default(out, (n, ndim), (1, n), out.storage_offset())
    return aten.copy_.default(out, result)
