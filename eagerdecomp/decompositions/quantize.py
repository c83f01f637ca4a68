"""Fake quantization (quantization-aware training) in core ops, with the CPU kernel's arithmetic.

``fake_quantize_per_tensor_affine`` (and the observers' ``_tensor_qparams`` form) rounds
each value to the quantization grid and back, and keeps a mask of the values that were in
range for the backward. The kernel's mixed-precision steps are reproduced one by one, so
the outputs are bitwise eager's.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.numerics import to_float32
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_TYPES = (torch.float32, torch.float64, torch.float16)
_ZP_RANGE = "`zero_point` must be between `quant_min` and `quant_max`."


def _check_range(quant_min, quant_max):
    """The kernels' argument checks, with their messages."""
    if quant_min > quant_max:
        raise RuntimeError("`quant_min` should be less than or         equal to `quant_max`.")


# NOTE: the kernel's steps and their precisions: inv_scale = 1.0f / scale (float; the double
# quotient rounded to float is the same number); x * inv_scale in float (double for double
# input); nearbyint (half to even: round); + zero_point in that type; fmax/fmin against the
# range in double (fmax ignores NaN: a NaN lands on quant_min), then int64; (q - zero_point)
# times the float scale in float; the mask compares the unclamped value with the range.
def _fake_quantize(self, scale, zero_point, quant_min, quant_max):
    _check_range(quant_min, quant_max)
    if not quant_min <= zero_point <= quant_max:
        raise RuntimeError(_ZP_RANGE)
    work = torch.float64 if self.dtype == torch.float64 else torch.float32
    sc = to_float32(scale)
    x = aten._to_copy.default(self, dtype=work)
    q = aten.add.Tensor(aten.round.default(aten.mul.Tensor(x, to_float32(1.0 / sc))), zero_point)
    wide = aten._to_copy.default(q, dtype=torch.float64)
    clamped = aten.clamp.default(wide, quant_min, quant_max)
    clamped = aten.where.self(aten.isnan.default(wide), aten.full_like.default(wide, quant_min), clamped)
    qint = aten.sub.Tensor(aten._to_copy.default(clamped, dtype=torch.int64), zero_point)
    out = aten._to_copy.default(aten.mul.Tensor(aten._to_copy.default(qint, dtype=torch.float32), sc), dtype=self.dtype)
    mask = aten.logical_and.default(aten.ge.Scalar(q, quant_min), aten.le.Scalar(q, quant_max))
    return out, mask


@project_decomposition(aten.fake_quantize_per_tensor_affine_cachemask.default)
def fake_quantize_cachemask(self, scale, zero_point, quant_min, quant_max):
    if self.dtype not in _TYPES:
        return NotImplemented  # the kernel has no other dtype (eager raises)
    return _fake_quantize(self, scale, zero_point, quant_min, quant_max)


# NOTE: the tensor_qparams form reads its scale, zero point and on/off switch as numbers
# (.item() in the kernel): a data value, so it decomposes eagerly on every call.
@project_decomposition(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def fake_quantize_cachemask_tensor_qparams(self, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    if self.dtype not in _TYPES:
        return NotImplemented
    item = aten._local_scalar_dense.default
    if not int(item(fake_quant_enabled)):
        return aten.clone.default(self), aten.full.default(list(self.shape), True, dtype=torch.bool, device=self.device)
    return _fake_quantize(self, float(item(scale)), int(item(zero_point)), quant_min, quant_max)


# NOTE: the per-channel kernel differs from the per-tensor one in its steps: with an integer
# zero point, q = int64(zero_point + nearbyint(x * inv_scale)) and the fake value is
# (clamp(q) - zero_point) * scale in double; with a float zero point (learnable QAT),
# q = lrintf(zero_point + x * inv_scale), rounding after the shift. inv_scale is 1.0f / scale
# per channel in float either way. A float zero point is taken for float32 and half input
# only: with double input the kernel rounds a double sum through lrintf's float argument.
def _name(dtype):
    return {
        torch.float64: "Double",
        torch.int64: "Long",
        torch.bfloat16: "BFloat16",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.bool: "Bool",
    }.get(dtype, str(dtype))


@project_decomposition(aten.fake_quantize_per_channel_affine_cachemask.default)
def fake_quantize_per_channel_cachemask(self, scale, zero_point, axis, quant_min, quant_max):
    integer_zp = not zero_point.dtype.is_floating_point
    if scale.dtype not in (torch.float32, torch.bfloat16):
        raise RuntimeError(f"Scale must be Float or BFloat16, found {_name(scale.dtype)}")
    if zero_point.dtype not in (torch.int32, torch.float32, torch.float16):
        raise RuntimeError(f"Zero-point must be Int32, Float or Half, found {_name(zero_point.dtype)}")
    _check_range(quant_min, quant_max)
    # NOTE: the zero points' range is checked on their values: a data value, so this op
    # decomposes eagerly on every call
    outside = aten.logical_or.default(aten.lt.Scalar(zero_point, quant_min), aten.gt.Scalar(zero_point, quant_max))
    if aten._local_scalar_dense.default(aten.any.default(outside)):
        raise RuntimeError(_ZP_RANGE)
    shape = [1] * self.dim()
    shape[axis] = -1
    work = torch.float64 if self.dtype == torch.float64 else torch.float32
    sc = aten.view.default(aten._to_copy.default(scale, dtype=torch.float32), shape)
    prod = aten.mul.Tensor(
        aten._to_copy.default(self, dtype=work), aten._to_copy.default(aten.reciprocal.default(sc), dtype=work)
    )
    if self.dtype not in _TYPES or (
        not integer_zp and (zero_point.dtype != torch.float32 or self.dtype == torch.float64)
    ):
        return NotImplemented
    zp = aten.view.default(aten._to_copy.default(zero_point, dtype=work), shape)
    shifted = (
        aten.add.Tensor(aten.round.default(prod), zp) if integer_zp else aten.round.default(aten.add.Tensor(zp, prod))
    )
    q = aten._to_copy.default(shifted, dtype=torch.int64)
    wide = lambda t: aten._to_copy.default(t, dtype=torch.float64)  # noqa: E731
    fake = aten.mul.Tensor(aten.sub.Tensor(aten.clamp.default(wide(q), quant_min, quant_max), wide(zp)), wide(sc))
    mask = aten.logical_and.default(aten.ge.Scalar(q, quant_min), aten.le.Scalar(q, quant_max))
    return aten._to_copy.default(fake, dtype=self.dtype), mask
