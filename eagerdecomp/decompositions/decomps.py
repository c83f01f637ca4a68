"""eagerdecomp's own decompositions: ops PyTorch leaves without one, or decomposes wrongly.

Each entry says why it exists. They are registered at import and take
precedence over ``torch._decomp``'s tables (user registrations win over them).
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch._prims_common import suggest_memory_format

from eagerdecomp.ops.checks import scalar_type_name
from eagerdecomp.decompositions.numerics import to_float32
from eagerdecomp.ops.overlap import guard
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten


@project_decomposition(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    # empty_like's only path; the strides of a tensor laid out in `physical_layout` order
    strides = [0] * len(size)
    step = 1
    for dim in reversed(physical_layout):
        strides[dim] = step
        step *= max(size[dim], 1)
    return aten.empty_strided.default(size, strides, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)


def _where_scalars(cond, a, b):
    dtype = torch.result_type(a, b)
    device = cond.device

    def as_tensor(v):
        if isinstance(v, torch.Tensor):
            return v if v.dtype == dtype else aten._to_copy.default(v, dtype=dtype)
        return aten.scalar_tensor.default(v, dtype=dtype, device=device)

    return aten.where.self(cond, as_tensor(a), as_tensor(b))


# NOTE: PyTorch's refs lower these through prims.where, whose aten implementation
# calls the same overload again: a cycle. A 0-dim tensor of the promoted dtype is exact.
@project_decomposition(aten.where.ScalarOther)
def where_scalar_other(condition, self, other):
    return _where_scalars(condition, self, other)


@project_decomposition(aten.where.ScalarSelf)
def where_scalar_self(condition, self, other):
    return _where_scalars(condition, self, other)


@project_decomposition(aten.where.Scalar)
def where_scalar(condition, self, other):
    return _where_scalars(condition, self, other)


# NOTE: the full reductions x.max() / x.min() have no decomposition in PyTorch;
# amax/amin over every dimension are core and return the same 0-dim tensor.
@project_decomposition(aten.max.default)
def max_all(self):
    return aten.amax.default(self, list(range(self.dim())))


@project_decomposition(aten.min.default)
def min_all(self):
    return aten.amin.default(self, list(range(self.dim())))


# NOTE: the refs lower item() through prims.item, whose aten implementation calls
# item() again: a cycle. _local_scalar_dense is core and is what item() runs.
@project_decomposition(aten.item.default)
def item(self):
    return aten._local_scalar_dense.default(self)


# NOTE: core ATen keeps select.int, so this only serves opsets without it (prims):
# PyTorch has neither a decomposition nor a ref for it.
@project_decomposition(aten.select.int)
def select_int(self, dim, index):
    dim = dim % self.dim()
    size = self.shape[dim]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} at dimension {dim}")
    index = index % size
    sizes = [n for d, n in enumerate(self.shape) if d != dim]
    strides = [st for d, st in enumerate(self.stride()) if d != dim]
    offset = self.storage_offset() + index * self.stride(dim)
    return torch.ops.prims.as_strided.default(self, sizes, strides, offset)


# NOTE: no decomposition in PyTorch. Indexing with a boolean mask is core
# (index.Tensor) and selects exactly the masked elements in row-major order.
@project_decomposition(aten.masked_select.default)
def masked_select(self, mask):
    shape = list(torch.broadcast_shapes(self.shape, mask.shape)) or [1]  # a 0-dim pair selects as 1-D
    return aten.index.Tensor(aten.expand.default(self, shape), [aten.expand.default(mask, shape)])


# NOTE: no decomposition in PyTorch for these two bool-returning comparisons, which
# test code calls all the time. Both read a data value, so they run on the bypass path.
@project_decomposition(aten.equal.default)
def equal(self, other):
    if self.shape != other.shape:
        return False
    return bool(aten._local_scalar_dense.default(aten.logical_not.default(aten.any.default(aten.ne.Tensor(self, other)))))


@project_decomposition(aten.allclose.default)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    close = aten.isclose.default(self, other, rtol, atol, equal_nan)
    return bool(aten._local_scalar_dense.default(aten.logical_not.default(aten.any.default(aten.logical_not.default(close)))))


# NOTE: PyTorch's decomposition is view + clone, which refuses an input that view cannot
# reshape (a transposed one); eager's copies whatever the layout, into a contiguous result.
@project_decomposition(aten.view_copy.default)
def view_copy(self, size):
    return aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), size)


# NOTE: forward-mode AD (torch.func.jvp, jacfwd) asks these of tangents and their views. They
# read storage metadata that no key holds (its size, its identity) and compute nothing; a call
# whose result is not a tensor is decomposed on every call, never traced (Runtime._route_for).
@project_decomposition(aten._has_same_storage_numel.default)
def has_same_storage_numel(self, other):
    return self.untyped_storage().nbytes() // self.element_size() == other.untyped_storage().nbytes() // other.element_size()


@project_decomposition(aten.is_set_to.default)
def is_set_to(self, tensor):
    return (
        self.untyped_storage()._cdata == tensor.untyped_storage()._cdata
        and self.storage_offset() == tensor.storage_offset()
        and self.shape == tensor.shape
        and self.stride() == tensor.stride()
    )


# NOTE: the refs lower these through prims whose aten implementation is the op itself
# (a cycle). Both are exact in core ops: NaN loses to a number, as fmax/fmin specify.
def _nan_ignoring(pick, self, other):
    best = pick(self, other)
    best = aten.where.self(aten.isnan.default(other), self, best)
    return aten.where.self(aten.isnan.default(self), other, best)


@project_decomposition(aten.fmax.default)
def fmax(self, other):
    return _nan_ignoring(aten.maximum.default, self, other)


@project_decomposition(aten.fmin.default)
def fmin(self, other):
    return _nan_ignoring(aten.minimum.default, self, other)


@project_decomposition(aten.exp2.default)
def exp2(self):
    # NOTE: a cycle through prims.exp2 otherwise; pow.Scalar is core. Integers and bools
    # promote to the default float dtype first, as exp2's type promotion does.
    if not (self.dtype.is_floating_point or self.dtype.is_complex):
        self = aten._to_copy.default(self, dtype=torch.get_default_dtype())
    return aten.pow.Scalar(2, self)


# NOTE: no decomposition in PyTorch. Eager's kernel adds one batch at a time into the result,
# an addmm per batch (beta applied by the first): the same chain of core addmm calls here,
# bitwise eager in every dtype (a bmm summed over the batch rounds in another order).
@project_decomposition(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    out = aten.expand.default(self, [batch1.shape[1], batch2.shape[2]])
    if batch1.shape[0] == 0:  # eager: self's copy, times beta in place (a float beta on integers refused)
        if beta == 0:
            return aten.zeros_like.default(out, memory_format=torch.contiguous_format)
        if type(beta) is float and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise RuntimeError(f"result type Float can't be cast to the desired output type {scalar_type_name(self.dtype)}")
        return aten.mul.Tensor(out, beta)
    for i in range(batch1.shape[0]):
        out = aten.addmm.default(out, aten.select.int(batch1, 0, i), aten.select.int(batch2, 0, i), beta=beta if i == 0 else 1, alpha=alpha)
    return out


# NOTE: resize_ is core; resize_as_ is resize_ to the template's sizes, then its memory
# format if one is asked for (as eager's resize_as_ does), preserve_format meaning the
# template's own (resize_ itself refuses preserve_format).
@project_decomposition(aten.resize_as_.default)
def resize_as_(self, the_template, *, memory_format=None):
    if memory_format == torch.preserve_format:
        memory_format = suggest_memory_format(the_template)
    return aten.resize_.default(self, the_template.shape, memory_format=memory_format)


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


# NOTE: no decomposition in PyTorch. Both pass the gradient outside [-lambd, lambd].
def _shrink_backward(grad_out, self, lambd):
    inside = aten.logical_and.default(aten.ge.Scalar(self, -lambd), aten.le.Scalar(self, lambd))
    return aten.where.self(inside, aten.scalar_tensor.default(0, dtype=grad_out.dtype, device=grad_out.device), grad_out)


@project_decomposition(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    return _shrink_backward(grad_out, self, lambd)


@project_decomposition(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return _shrink_backward(grad_output, self, lambd)


# NOTE: no decomposition in PyTorch. put indexes self as if it were 1-D: index_put
# (core) on the flattened tensor is the same, negative indices and accumulate included.
@project_decomposition(aten.put.default)
def put(self, index, source, accumulate=False):
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    out = aten.index_put.default(flat, [aten.view.default(index, [-1])], aten.view.default(source, [-1]), accumulate)
    return aten.view.default(out, list(self.shape))


def _runs(values, return_inverse, return_counts, order=None):
    """Unique runs of a 1-D ``values``: ``(firsts, inverse, counts)`` as unique's kernels return them.

    ``order`` maps positions of ``values`` back to the input's (a sort's indices), if any.
    """
    n = values.shape[0]
    empty = aten.full.default([0], 0, dtype=torch.int64, device=values.device)
    if n == 0:
        return values, empty, empty
    starts = aten.ne.Tensor(aten.slice.Tensor(values, 0, 1), aten.slice.Tensor(values, 0, 0, -1))
    starts = aten.cat.default([aten.full.default([1], True, dtype=torch.bool, device=values.device), starts])
    firsts = aten.index.Tensor(values, [starts])
    group = aten.sub.Tensor(aten.cumsum.default(starts, 0, dtype=torch.int64), 1)
    inverse, counts = empty, empty
    if return_inverse:
        inverse = group if order is None else aten.index_put.default(aten.full_like.default(group, 0), [order], group)
    if return_counts:
        zeros = aten.full.default([firsts.shape[0]], 0, dtype=torch.int64, device=values.device)
        counts = aten.index_put.default(zeros, [group], aten.full_like.default(group, 1), True)
    return firsts, inverse, counts


# NOTE: no decomposition in PyTorch for torch.unique's kernels. Sorting (core) and
# comparing neighbours gives eager's answer exactly: NaNs sort last and, never equal
# to each other, each stays its own value, as in the CPU kernel. With sorted=False the
# order is unspecified; the CPU kernel returns sorted values then too, and so does this.
@project_decomposition(aten._unique2.default)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, order = aten.sort.default(aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1]))
    firsts, inverse, counts = _runs(values, return_inverse, return_counts, order)
    if return_inverse:
        inverse = aten.view.default(inverse, list(self.shape))
    return firsts, inverse, counts


def unique_consecutive_flat(self, return_inverse=False, return_counts=False):
    """unique_consecutive with dim=None (order.py registers the op and handles dim=)."""
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    firsts, inverse, counts = _runs(flat, return_inverse, return_counts)
    if return_inverse:
        inverse = aten.view.default(inverse, list(self.shape))
    return firsts, inverse, counts


# NOTE: _is_all_true/_is_any_true (torch.distributions' argument checks call them) take a
# bool tensor and return a 0-dim bool: all/any of it.
@project_decomposition(aten._is_all_true.default)
def is_all_true(self):
    return aten.all.default(self)


@project_decomposition(aten._is_any_true.default)
def is_any_true(self):
    return aten.any.default(self)


# NOTE: _assert_async checks a one-element tensor is nonzero (NaN counts as nonzero) and raises
# eager's error otherwise. Reading the value makes it decompose eagerly on every call; on
# an accelerator that is the host sync the native op avoids, but its answer is eager's.
def _assert_nonzero(self, message):
    if self.numel() != 1:
        raise RuntimeError(f"Boolean value of Tensor with {'no values' if self.numel() == 0 else 'more than one value'} is ambiguous")
    if not aten._local_scalar_dense.default(aten.ne.Scalar(self, 0)):
        raise RuntimeError(message)


@project_decomposition(aten._assert_async.default)
def assert_async(self):
    _assert_nonzero(self, "Expected Tensor with single nonzero value, but got zero")


@project_decomposition(aten._assert_async.msg)
def assert_async_msg(self, assert_msg):
    _assert_nonzero(self, assert_msg)


# NOTE: no decomposition in PyTorch for the full reductions. The lower median of the
# sorted values; median propagates NaN, nanmedian skips NaNs (all-NaN gives NaN).
def _lower_median(self, skip_nan: bool):
    flat = aten.view.default(aten.clone.default(self, memory_format=torch.contiguous_format), [-1])
    n = flat.shape[0]
    if n == 0:
        return aten.full.default([], float("nan"), dtype=self.dtype, device=self.device)
    values = aten.sort.default(flat)[0]  # NaNs last
    if not self.dtype.is_floating_point:
        return aten.select.int(values, 0, (n - 1) // 2)
    nans = aten.sum.default(aten.isnan.default(flat), dtype=torch.int64)
    if skip_nan:
        count = aten.sub.Tensor(aten.scalar_tensor.default(n, dtype=torch.int64, device=self.device), nans)
        at = aten.clamp.default(aten.floor_divide.default(aten.sub.Tensor(count, 1), 2), 0)
        pick = aten.squeeze.dim(aten.gather.default(values, 0, aten.unsqueeze.default(at, 0)), 0)
        return pick  # with every value NaN, at is 0 and values[0] is NaN
    pick = aten.select.int(values, 0, (n - 1) // 2)
    nan = aten.scalar_tensor.default(float("nan"), dtype=self.dtype, device=self.device)
    return aten.where.self(aten.gt.Scalar(nans, 0), nan, pick)


@project_decomposition(aten.median.default)
def median(self):
    return _lower_median(self, skip_nan=False)


@project_decomposition(aten.nanmedian.default)
def nanmedian(self):
    return _lower_median(self, skip_nan=True)


@project_decomposition(aten._unique.default)
def unique(self, sorted=True, return_inverse=False):
    firsts, inverse, _ = unique2(self, sorted, return_inverse, False)
    return firsts, inverse


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
    src = aten.mul.Tensor(dst, step) if align_corners else aten.sub.Tensor(aten.mul.Tensor(aten.add.Tensor(dst, 0.5), step), 0.5)
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
        corners.append([(aten.view.default(ix, shape), aten.view.default(w, shape))
                        for ix, w in _linear_source(i, o, align_corners, s, acc, grad.device)])
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
def upsample_trilinear3d_backward(grad_output, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear_backward(grad_output, output_size, input_size, align_corners, [scales_d, scales_h, scales_w])


# NOTE: clip_grad_norm_ calls this with foreach on CUDA and PrivateUse1 devices; no
# per-tensor overload of norm has its signature, so it is mapped by hand.
@project_decomposition(aten._foreach_norm.Scalar)
def foreach_norm(self, ord=2, dtype=None):
    return [aten.linalg_vector_norm.default(t, ord, dtype=dtype) for t in self]


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


# -- fixes found by the uncapped conformance run (every OpInfo sample) ---------------------------


def _torch_decomposition(op):
    from torch._decomp import decomposition_table

    return decomposition_table[op]


# NOTE: linspace and logspace (declined here before at integer and 16-bit dtypes) are replayed
# operation by operation as eager's kernels compute them in spacing.py.


# NOTE: eager's max_unpool2d keeps a channels-last input channels-last; torch's decomposition
# returns a contiguous result (OpInfo samples 36+ at every float dtype: strides differ).
@project_decomposition(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
    out = _torch_decomposition(aten.max_unpool2d.default)(self, indices, output_size)
    if self.dim() == 4 and torch._prims_common.suggest_memory_format(self) == torch.channels_last:
        out = aten.clone.default(out, memory_format=torch.channels_last)
    return out


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
        resize_out(out, (ndim, n))
        aten.as_strided_.default(out, (n, ndim), (1, n), out.storage_offset())
    return aten.copy_.default(out, result)


# -- cheaper paths where PyTorch's decomposition is wasteful --------------------------------------


# NOTE: torch._refs.lerp turns a number weight into a 0-dim tensor and picks both the
# coefficient and the base with where(): five full-size passes and five on 0-dim tensors
# (AdamW's lerp_ runs them per parameter per step), and its separate mul and add round
# twice. Eager's kernel picks its branch once from the weight as its dtype holds it, then
# computes fma(coeff, end - start, base), which is add's alpha: float32 and float64 results
# equal eager's bit for bit. The branch is a Python branch on the weight: a lifted weight
# below 0.5 keeps one kernel (eagerdecomp.lift's bands split there for this); above, the
# coefficient weight - 1 is a computed constant, so those keys go by value.
@project_decomposition(aten.lerp.Scalar)
def lerp_scalar(self, end, weight):
    dtype = self.dtype
    if dtype not in (torch.float32, torch.float64) or end.dtype != dtype or type(weight) not in (int, float, bool):
        return _torch_decomposition(aten.lerp.Scalar)(self, end, weight)
    w = to_float32(float(weight)) if dtype == torch.float32 else float(weight)
    diff = aten.sub.Tensor(end, self)
    if abs(w) < 0.5:
        return aten.add.Tensor(self, diff, alpha=weight)
    coeff = to_float32(w - 1.0) if dtype == torch.float32 else w - 1.0
    return aten.add.Tensor(end, diff, alpha=coeff)
