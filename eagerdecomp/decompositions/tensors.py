"""Tensors themselves rather than a computation on their values: allocation, resizing, copies,
storage metadata, and the ops that read a tensor's values back to Python.

``empty_permuted`` (``empty_like``'s only path), ``resize_as_`` and ``view_copy``; the storage
questions forward-mode AD asks (``_has_same_storage_numel``, ``is_set_to``); ``item``,
``equal``, ``allclose``, ``_is_all_true``/``_is_any_true`` and ``_assert_async``. PyTorch has no
decomposition that reaches core ops for any of them (or one that cycles through prims, or
refuses a layout eager accepts), and they belong to no family of computations, so they live
here. Each is a few core ops, or none (the storage questions compute nothing); those that read
a value back to Python run on the bypass path (decomposed on every call, never traced).
"""

from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from eagerdecomp.decompositions.registry import project_decomposition

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


# NOTE: resize_ is core; resize_as_ is resize_ to the template's sizes, then its memory
# format if one is asked for (as eager's resize_as_ does), preserve_format meaning the
# template's own (resize_ itself refuses preserve_format).
@project_decomposition(aten.resize_as_.default)
def resize_as_(self, the_template, *, memory_format=None):
    if memory_format == torch.preserve_format:
        memory_format = suggest_memory_format(the_template)
    return aten.resize_.default(self, the_template.shape, memory_format=memory_format)


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
    return (
        self.untyped_storage().nbytes() // self.element_size()
        == other.untyped_storage().nbytes() // other.element_size()
    )


@project_decomposition(aten.is_set_to.default)
def is_set_to(self, tensor):
    return (
        self.untyped_storage()._cdata == tensor.untyped_storage()._cdata
        and self.storage_offset() == tensor.storage_offset()
        and self.shape == tensor.shape
        and self.stride() == tensor.stride()
    )


# NOTE: the refs lower item() through prims.item, whose aten implementation calls
# item() again: a cycle. _local_scalar_dense is core and is what item() runs.
@project_decomposition(aten.item.default)
def item(self):
    return aten._local_scalar_dense.default(self)


# NOTE: no decomposition in PyTorch for these two bool-returning comparisons, which
# test code calls all the time. Both read a data value, so they run on the bypass path.
@project_decomposition(aten.equal.default)
def equal(self, other):
    if self.shape != other.shape:
        return False
    return bool(
        aten._local_scalar_dense.default(aten.logical_not.default(aten.any.default(aten.ne.Tensor(self, other))))
    )


@project_decomposition(aten.allclose.default)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    close = aten.isclose.default(self, other, rtol, atol, equal_nan)
    return bool(
        aten._local_scalar_dense.default(aten.logical_not.default(aten.any.default(aten.logical_not.default(close))))
    )


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
        raise RuntimeError(
            f"Boolean value of Tensor with {'no values' if self.numel() == 0 else 'more than one value'} is ambiguous"
        )
    if not aten._local_scalar_dense.default(aten.ne.Scalar(self, 0)):
        raise RuntimeError(message)


@project_decomposition(aten._assert_async.default)
def assert_async(self):
    _assert_nonzero(self, "Expected Tensor with single nonzero value, but got zero")


@project_decomposition(aten._assert_async.msg)
def assert_async_msg(self, assert_msg):
    _assert_nonzero(self, assert_msg)
