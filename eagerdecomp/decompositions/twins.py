"""Private ATen ops that are a public op (or two) under another name.

Old or internal entry points (``_aminmax``, ``_stack``, ``slow_conv3d_forward``, the
``*_copy`` twins of views, the fused ``_add_relu``) still reach backends from TorchScript
models, quantization passes and older code. Each computes exactly what the public op
computes; the note on each says where the twin differs and how that is kept.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


@project_decomposition(aten._aminmax.default)
def aminmax_all(self):
    return aten.aminmax.default(self)


@project_decomposition(aten._aminmax.dim)
def aminmax_dim(self, dim, keepdim=False):
    return aten.aminmax.default(self, dim=dim, keepdim=keepdim)


@project_decomposition(aten._logcumsumexp.default)
def logcumsumexp(self, dim):
    return aten.logcumsumexp.default(self, dim)


@project_decomposition(aten._stack.default)
def stack(tensors, dim=0):
    return aten.stack.default(tensors, dim)


# NOTE: the *_copy twins of view ops return a contiguous copy of the view.
@project_decomposition(aten._neg_view_copy.default)
def neg_view_copy(self):
    return aten.neg.default(self)


@project_decomposition(aten._reshape_alias_copy.default)
def reshape_alias_copy(self, size, stride):
    view = aten.as_strided.default(self, size, stride, self.storage_offset())
    return aten.clone.default(view, memory_format=torch.contiguous_format)


@project_decomposition(aten.slow_conv3d_forward.default)
def slow_conv3d_forward(self, weight, kernel_size, bias, stride, padding):
    return aten.convolution.default(self, weight, bias, stride, padding, [1, 1, 1], False, [0, 0, 0], 1)


# NOTE: _add_relu's CPU kernel takes max(0, self + alpha * other) two ways: its vectorized
# body keeps a NaN sum, its scalar tail (the last elements, fewer than a vector) turns it
# into 0, so eager's answer for NaN depends on where the element sits. This keeps the NaN,
# as the body does for almost every element (relu's rule); any other sum is exact. The
# kernel has no 16-bit float types: those calls have no path, as eager raises for them.
def _positive_part(x):
    keep = (
        aten.logical_or.default(aten.gt.Scalar(x, 0), aten.isnan.default(x))
        if x.is_floating_point()
        else aten.gt.Scalar(x, 0)
    )
    return aten.where.self(keep, x, aten.zeros_like.default(x))


_ADD_RELU_TYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@project_decomposition(aten._add_relu.Tensor)
def add_relu(self, other, *, alpha=1):
    out = aten.add.Tensor(self, other, alpha=alpha)
    return _positive_part(out) if out.dtype in _ADD_RELU_TYPES else NotImplemented


@project_decomposition(aten._add_relu.Scalar)
def add_relu_scalar(self, other, alpha=1):
    out = aten.add.Scalar(self, other, alpha)
    return _positive_part(out) if out.dtype in _ADD_RELU_TYPES else NotImplemented


# NOTE: in training, native_batch_norm is _native_batch_norm_legit under its old schema (one that
# does not declare the running statistics written): ATen's CPU and CUDA kernels of both are one
# function (batch_norm_cpu, batch_norm_cuda), and core ATen keeps the legit op so batch norm stays
# one kernel. PyTorch's table spells it out in ~35 pointwise and reduction ops instead, which
# round apart from the kernel (on edref, SmallCNN's two BatchNorm2d layers made its training step
# 367 kernels where it is now 303). Evaluation keeps PyTorch's decomposition: there the saved statistics differ by
# device (CPU's are empty, other devices' and the meta kernel's are per channel), and so do out=
# calls that follow the meta kernel; so do running statistics given for one of mean and variance
# only (no legit overload takes that, eager raises), and mixed dtypes (a bfloat16 input with
# float32 parameters under autocast: native_batch_norm saves its statistics in the input's dtype,
# the legit op in float32).
@project_decomposition(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    mixed = any(t is not None and t.dtype != input.dtype for t in (weight, bias, running_mean, running_var))
    if training and not mixed and running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if training and not mixed and running_mean is not None and running_var is not None:
        return aten._native_batch_norm_legit.default(
            input, weight, bias, running_mean, running_var, training, momentum, eps
        )
    from torch._decomp.decompositions import native_batch_norm as spelled_out

    return spelled_out(input, weight, bias, running_mean, running_var, training, momentum, eps)
