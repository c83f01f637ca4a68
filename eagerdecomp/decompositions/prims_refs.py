"""Where a prims opset lowers through ``torch._refs`` and a ref answers otherwise than eager.

An aten-based opset never meets these refs (core ATen keeps ``fill``, ``full_like`` and
``empty``); a prims opset (``prims``, ``prims_fusion``) lowers every factory through them.
:func:`eagerdecomp.decompositions.table.default_table` puts :data:`PRIMS_TABLE` above the refs
for such opsets only. Each entry converts an argument as eager's C++ does (a fill value, a
``None`` layout or memory format) or steps around a prim's meta (a 0-d ``as_strided``) or checks what eager's kernel
refuses (a non-contiguous ``native_group_norm`` input), then calls the ref; views and reshapes
decide whether a view exists by ATen's rule (:func:`view_strides`), not the refs'.
"""

from __future__ import annotations

import math

import torch
import torch._prims_common as utils
import torch._refs as refs

__all__ = ["PRIMS_TABLE", "eager_fill_value"]

aten = torch.ops.aten

# The C type eager's overflow message names for an integer dtype.
_C_TYPES = {
    torch.uint8: "uint8_t",
    torch.int8: "int8_t",
    torch.int16: "short",
    torch.int32: "int",
    torch.int64: "int64_t",
}


def eager_fill_value(value, dtype):
    """``value`` as eager's Scalar conversion to ``dtype`` gives it: truncated toward zero into an
    integer dtype (``RuntimeError`` past its range, or NaN and inf, as eager), ``value != 0`` into
    bool. Other values and dtypes come back as they are (the ref judges them).

    NOTE: ``torch._refs.fill`` refuses a number of a wider Python type than the dtype's (``0.0``
    into int64, which ``F.pad``'s default value is; ``0`` into bool, which ``zeros(out=bool)``
    writes), where eager converts it.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if dtype == torch.bool:
        return value != 0
    if dtype not in _C_TYPES:
        return value
    info = torch.iinfo(dtype)
    if not math.isfinite(value) or not info.min <= value <= info.max:
        raise RuntimeError(f"value cannot be converted to type {_C_TYPES[dtype]} without overflow")
    return int(value)  # (C++'s static_cast truncates toward zero, as int() does)


def fill(self, value):
    return refs.fill(self, eager_fill_value(value, self.dtype))


def full_like(self, fill_value, *, dtype=None, **kwargs):
    return refs.full_like(self, eager_fill_value(fill_value, dtype or self.dtype), dtype=dtype, **kwargs)


def empty(size, *, memory_format=None, **kwargs):
    # NOTE: eager reads memory_format=None (what torch.empty(3) passes) as contiguous; the ref
    # accepts only a memory format, so torch.empty(3) failed under a prims opset
    return refs.empty(size, memory_format=torch.contiguous_format if memory_format is None else memory_format, **kwargs)


def _strided_when_none(ref):
    """``ref`` with eager's reading of ``layout=None``: strided.

    NOTE: the factory refs check ``layout == torch.strided`` and refuse None, which eager's
    Python API passes for every call that names no layout (``torch.full((2,), 1.0)``,
    ``torch.arange(1, 7, 2)``, ``torch.empty_strided``)."""

    def factory(*args, layout=None, **kwargs):
        return ref(*args, layout=torch.strided if layout is None else layout, **kwargs)

    factory.__name__ = factory.__qualname__ = ref.__name__
    return factory


def scalar_tensor(s, *, dtype=None, layout=None, **kwargs):
    # NOTE: eager's scalar_tensor makes the default dtype whatever the number; the ref infers
    # it from the number's type (torch.scalar_tensor(3) was int64)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    return refs.scalar_tensor(s, dtype=dtype, layout=torch.strided if layout is None else layout, **kwargs)


def as_strided(a, size, stride, storage_offset=None):
    if len(size) == 0:
        # NOTE: prims.as_strided's meta multiplies the sizes with reduce() and no start value, so
        # a 0-d view (as_strided's gradient at a one-element input) raised TypeError: take one
        # element, then squeeze its dim (the same memory, a view as eager's)
        return refs.squeeze(refs.as_strided(a, [1], [1], storage_offset), 0)
    return refs.as_strided(a, size, stride, storage_offset)


def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    # NOTE: eager's CPU kernel refuses an input that is not contiguous in its own memory format
    # (a column-major or strided one; channels-last is fine); the ref computes any layout, so the
    # mode answered where eager raises (test_layouts.py under prims_fusion)
    if not input.is_contiguous(memory_format=utils.suggest_memory_format(input)):
        raise RuntimeError(
            "Expected X.is_contiguous(memory_format) to be true, but got false.  (Could this error message be "
            "improved?  If so, please report an enhancement request to PyTorch.)"
        )
    return refs.native_group_norm(input, weight, bias, N, C, HxW, group, eps)


# -- views by shape: ATen's rule for when one exists --------------------------------------------------


def view_strides(shape, stride, new_shape):
    """The strides of a view of ``(shape, stride)`` as ``new_shape`` (same numel), or None where no
    view exists: ATen's rule (``computeStride``), chunk by chunk of dims whose strides chain.

    NOTE: the refs decide with ``prims._collapse_view_helper``, which passes a pair of dims when
    either is 1, so a size-1 dim between two dims whose strides do not chain ([2, 1, 3] strides
    (5, 3, 1), a slice of a clone of an expanded tensor: ``repeat``'s own ref makes one) passed
    for a view; ``collapse_view``'s ATen form then raised where eager's ``reshape`` copies."""
    if math.prod(shape) == 0:
        return list(stride) if list(shape) == list(new_shape) else list(utils.make_contiguous_strides_for(new_shape))
    shape, stride = (list(shape), list(stride)) if shape else ([1], [1])
    new_stride = [0] * len(new_shape)
    view_d, base = len(new_shape) - 1, stride[-1]
    numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and stride[d - 1] != numel * base):
            while view_d >= 0 and (view_numel < numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != numel:
                return None
            if d > 0:
                base, numel, view_numel = stride[d - 1], 1, 1
    return new_stride if view_d == -1 else None


def view(a, size):
    new_shape = utils.infer_size(size, a.numel())
    new_stride = view_strides(a.shape, a.stride(), new_shape)
    if new_stride is None:
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension spans "
            "across two contiguous subspaces). Use .reshape(...) instead."
        )
    return as_strided(a, new_shape, new_stride, a.storage_offset())  # (below: a 0-d view too)


def reshape(a, shape):
    new_shape = utils.infer_size(shape, a.numel())
    if view_strides(a.shape, a.stride(), new_shape) is None:  # eager copies, contiguous, then views
        a = refs.clone(a, memory_format=torch.contiguous_format)
    return view(a, new_shape)


def _wide_reduction(ref):
    """``ref`` (``refs.sum`` or ``refs.prod``), computed in int64 where the result
    is a narrower integer or bool.

    NOTE: ``prims.sum`` and ``prims.prod`` say a result of their input's dtype (their meta), but
    their ATen form (``torch.sum``/``torch.prod``, the kernel the mode calls) promotes bool and
    integers narrower than int64 to int64. Run direct, the ref saw the int64 and converted back;
    a traced kernel read it through the meta and returned int64 (``prod(x, 1, dtype=torch.bool)``
    was an int64 tensor). Wrapping integer arithmetic is modular, so a sum or product in int64
    converted to the narrow type is eager's value, and bool's (eager's OR and AND) is whether the
    int64 count or product is nonzero."""

    def reduce(a, *args, dtype=None, **kwargs):
        # (without a dtype, bool and integer inputs give int64 already)
        if dtype is None or dtype == torch.int64 or dtype.is_floating_point or dtype.is_complex:
            return ref(a, *args, dtype=dtype, **kwargs)
        if a.dtype != dtype:  # eager casts the input to dtype first (a float 0.5 to int 0, to bool True)
            a = refs.to(a, dtype)
        return refs.to(ref(a, *args, dtype=torch.int64, **kwargs), dtype)

    return reduce


PRIMS_TABLE = {
    aten.sum.default: _wide_reduction(refs.sum),
    aten.sum.dim_IntList: _wide_reduction(refs.sum),
    aten.prod.default: _wide_reduction(refs.prod),
    aten.prod.dim_int: _wide_reduction(refs.prod),
    aten.view.default: view,
    aten._unsafe_view.default: view,
    aten.reshape.default: reshape,
    aten.native_group_norm.default: native_group_norm,
    aten.as_strided.default: as_strided,
    aten.fill.Scalar: fill,
    aten.full_like.default: full_like,
    aten.empty.memory_format: empty,
    aten.full.default: _strided_when_none(refs.full),
    aten.empty_strided.default: _strided_when_none(refs.empty_strided),
    aten.scalar_tensor.default: scalar_tensor,
    aten.arange.default: _strided_when_none(refs.arange),
    aten.arange.start: _strided_when_none(refs.arange),
    aten.arange.start_step: _strided_when_none(refs.arange),
}
