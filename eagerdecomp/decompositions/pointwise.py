"""Elementwise ops with no path to core ATen in PyTorch's tables: float anatomy, shifts, angle,
hypot, the Scalar overloads of ``where``, ``fmax``/``fmin`` and ``exp2`` (whose refs cycle
through prims); and ``lerp.Scalar``, whose ref is slower than eager's formula and rounds twice.

Each decomposition is exact (the result is the value eager's kernel returns, not an
approximation), except where its note says otherwise (``hypot`` at float64): the float
anatomy (``frexp``, ``nextafter``, ``signbit``) is read with comparisons and exact powers of two
(``pow(2.0, e)`` is exact for integer ``e``, ``x * 2**k`` is exact away from under/overflow),
shifts are products and floor divisions by powers of two in the integer dtype, which wraps as
the kernel's shift does.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.numerics import to_float32
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_F64 = torch.float64

# (precision p, smallest normal exponent, largest finite) per float format, for nextafter
_FORMAT = {
    torch.float32: (24, -126, 3.4028234663852886e38),
    torch.float64: (53, -1022, 1.7976931348623157e308),
    torch.bfloat16: (8, -126, 3.3895313892515355e38),
    torch.float16: (11, -14, 65504.0),
}
_SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)


def _f64(x):
    return aten._to_copy.default(x, dtype=_F64)


def _pow2(e):
    """``2.0 ** e`` for an integer-valued float64 tensor ``e`` (exact: eager's pow is, for base 2)."""
    return aten.pow.Scalar(2.0, e)


def _exponent(a):
    """``floor(log2(a))`` for finite ``a > 0`` in float64, exactly: log2 is rounded, so the
    guess is checked against the powers of two on either side and moved by one."""
    e = aten.floor.default(aten.log2.default(a))
    e = aten.where.self(aten.gt.Tensor(_pow2(e), a), aten.sub.Tensor(e, 1.0), e)
    return aten.where.self(aten.le.Tensor(_pow2(aten.add.Tensor(e, 1.0)), a), aten.add.Tensor(e, 1.0), e)


# NOTE: hypot has no decomposition; eager's kernel neither overflows nor underflows in the
# intermediate square, and an infinite operand wins over a NaN. 16- and 32-bit floats square
# in float64 (no overflow possible) and round once; float64 scales by the larger magnitude:
# m * sqrt(1 + (n/m)^2), a few ulp from the exact value (the accuracy rule's rtol is 1e-7).
@project_decomposition(aten.hypot.default)
def hypot(self, other):
    dtype = torch.result_type(self, other)
    if not dtype.is_floating_point:
        return NotImplemented
    a, b = aten.abs.default(_f64(self)), aten.abs.default(_f64(other))
    if dtype == _F64:
        m, n = aten.maximum.default(a, b), aten.minimum.default(a, b)
        r = aten.div.Tensor(n, m)
        out = aten.mul.Tensor(m, aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(r, r), 1.0)))
        out = aten.where.self(aten.eq.Scalar(m, 0.0), aten.zeros_like.default(out), out)
    else:
        out = aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(a, a), aten.mul.Tensor(b, b)))
    inf = aten.logical_or.default(aten.isinf.default(a), aten.isinf.default(b))
    out = aten.where.self(inf, aten.full_like.default(out, math.inf), out)
    return aten._to_copy.default(out, dtype=dtype)


# NOTE: angle of a real number is pi below zero, 0 otherwise (-0.0 too), NaN kept; integers
# and bool give the default float dtype. Complex input needs its real and imaginary parts
# (a dtype view Core ATen lacks): declined.
@project_decomposition(aten.angle.default)
def angle(self):
    if self.dtype.is_complex:
        return NotImplemented
    dtype = self.dtype if self.dtype.is_floating_point else torch.get_default_dtype()
    x = aten._to_copy.default(self, dtype=dtype)
    pi = aten.where.self(aten.lt.Scalar(x, 0), aten.full_like.default(x, math.pi), aten.zeros_like.default(x))
    return aten.where.self(aten.isnan.default(x), x, pi)


# NOTE: frexp splits x into mantissa in [0.5, 1) and an int32 exponent; 0, inf and NaN give
# (x, 0). Computed in float64, where every float32/16-bit value is normal: the exponent by
# _exponent, the mantissa by two exact power-of-two scalings (one would overflow or reach the
# subnormals at the ends of float64's range). Both are exact.
@project_decomposition(aten.frexp.Tensor)
def frexp(self):
    if not self.dtype.is_floating_point:
        return NotImplemented
    x = _f64(self)
    a = aten.abs.default(x)
    regular = aten.logical_and.default(
        aten.ne.Scalar(a, 0.0),
        aten.logical_not.default(aten.logical_or.default(aten.isinf.default(a), aten.isnan.default(a))),
    )
    safe = aten.where.self(regular, a, aten.ones_like.default(a))
    e = aten.add.Tensor(_exponent(safe), 1.0)
    half = aten.floor.default(aten.div.Tensor(e, 2.0))
    m = aten.mul.Tensor(aten.mul.Tensor(x, _pow2(aten.neg.default(half))), _pow2(aten.sub.Tensor(half, e)))
    mantissa = aten._to_copy.default(aten.where.self(regular, m, x), dtype=self.dtype)
    exponent = aten._to_copy.default(aten.where.self(regular, e, aten.zeros_like.default(e)), dtype=torch.int32)
    return mantissa, exponent


# NOTE: nextafter(x, y) is the float after x toward y (y itself when equal, NaN if either is).
# The step is the spacing at x's binade, 2^(e - p + 1), halved when moving toward zero from an
# exact power of two, never below the smallest subnormal; from 0 it is that subnormal with
# y's side's sign; from an infinity toward y it is the largest finite. Narrower formats are
# computed in float64 with their own format constants; every sum is exact and the result representable.
@project_decomposition(aten.nextafter.default)
def nextafter(self, other):
    dtype = torch.result_type(self, other)
    if dtype not in _FORMAT:
        return NotImplemented
    p, emin, big = _FORMAT[dtype]
    x = _f64(aten._to_copy.default(self, dtype=dtype))
    y = _f64(aten._to_copy.default(other, dtype=dtype))
    a = aten.abs.default(x)
    finite_nonzero = aten.logical_and.default(
        aten.ne.Scalar(a, 0.0),
        aten.logical_not.default(aten.logical_or.default(aten.isinf.default(a), aten.isnan.default(a))),
    )
    safe = aten.where.self(finite_nonzero, a, aten.ones_like.default(a))
    e = aten.clamp.default(_exponent(safe), emin)
    step = _pow2(aten.sub.Tensor(e, float(p - 1)))
    up = aten.gt.Tensor(y, x)
    toward_zero = aten.ne.Tensor(up, aten.gt.Scalar(x, 0.0))
    power = aten.logical_and.default(aten.eq.Tensor(safe, _pow2(e)), aten.gt.Scalar(e, float(emin)))
    step = aten.where.self(aten.logical_and.default(toward_zero, power), aten.mul.Tensor(step, 0.5), step)
    signed = aten.where.self(up, step, aten.neg.default(step))
    out = aten.add.Tensor(x, signed)
    tiny = _pow2(aten.full_like.default(x, float(emin - p + 1)))
    out = aten.where.self(aten.eq.Scalar(x, 0.0), aten.where.self(up, tiny, aten.neg.default(tiny)), out)
    out = aten.where.self(aten.isinf.default(x), aten.mul.Tensor(aten.sign.default(x), big), out)
    out = aten.where.self(aten.eq.Tensor(x, y), y, out)
    nan = aten.logical_or.default(aten.isnan.default(x), aten.isnan.default(y))
    out = aten.where.self(nan, aten.full_like.default(x, math.nan), out)
    return aten._to_copy.default(out, dtype=dtype)


# NOTE: signbit is the sign bit: set for negatives, -0.0 (seen as 1/x == -inf) and a NaN with
# its sign set. No core op reads a NaN's sign, so a call whose input holds a NaN is declined
# (a data value: such calls decompose eagerly, on the bypass path). Integers: x < 0.
def _signbit(self):
    if self.dtype.is_complex:
        return NotImplemented
    if not self.dtype.is_floating_point:
        return aten.lt.Scalar(self, 0)
    if aten._local_scalar_dense.default(aten.any.default(aten.isnan.default(self))):
        return NotImplemented
    zero_neg = aten.logical_and.default(aten.eq.Scalar(self, 0), aten.lt.Scalar(aten.reciprocal.default(self), 0))
    return aten.logical_or.default(aten.lt.Scalar(self, 0), zero_neg)


project_decomposition(aten.signbit.default)(_signbit)
project_decomposition(torch.ops.prims.signbit.default)(_signbit)


def _shift_operands(self, other):
    dtype = torch.result_type(self, other)
    if dtype not in _SIGNED and dtype != torch.uint8:
        return None
    if not isinstance(other, torch.Tensor):  # a Python number (the Scalar overloads)
        if not isinstance(other, int):
            return None
        return (
            dtype,
            aten._to_copy.default(self, dtype=dtype),
            aten.scalar_tensor.default(other, dtype=dtype, device=self.device),
        )
    return dtype, aten._to_copy.default(self, dtype=dtype), aten._to_copy.default(other, dtype=dtype)


# NOTE: the kernel shifts in the promoted integer dtype (both operands cast to it) and
# defines shifts past the width: a left shift by a negative amount or by >= the width gives
# 0; a right shift then gives the sign fill (-1 for negatives, else 0). Within the width,
# a << s is a * 2^s (integer multiplication wraps as the shift drops bits) and a >> s is
# floor(a / 2^s) (arithmetic shift); 2^s is an integer pow in the dtype (2^(w-1) wraps to
# the dtype's minimum, whose product still drops the right bits). Exact.
@project_decomposition(aten.bitwise_left_shift.Tensor)
def bitwise_left_shift(self, other):
    ops = _shift_operands(self, other)
    if ops is None:
        return NotImplemented
    dtype, a, b = ops
    width = dtype.itemsize * 8
    s = aten.clamp.default(b, 0, width - 1)
    shifted = aten.mul.Tensor(a, aten.pow.Scalar(2, s))
    inside = aten.logical_and.default(aten.ge.Scalar(b, 0), aten.lt.Scalar(b, width))
    return aten.where.self(inside, shifted, aten.zeros_like.default(shifted))


@project_decomposition(aten.bitwise_right_shift.Tensor)
def bitwise_right_shift(self, other):
    ops = _shift_operands(self, other)
    if ops is None:
        return NotImplemented
    dtype, a, b = ops
    width = dtype.itemsize * 8
    top = width - 1 if dtype == torch.uint8 else width - 2  # the largest shift 2^s fits the dtype for
    s = aten.clamp.default(b, 0, top)
    shifted = aten.div.Tensor_mode(a, aten.pow.Scalar(2, s), rounding_mode="floor")
    inside = aten.logical_and.default(aten.ge.Scalar(b, 0), aten.le.Scalar(b, top))
    fill = aten.zeros_like.default(a)
    if dtype != torch.uint8:
        fill = aten.where.self(aten.lt.Scalar(a, 0), aten.full_like.default(a, -1), fill)
    return aten.where.self(inside, shifted, fill)


# NOTE: the operators (x << y, x >> y) run the same shift kernels on integers.
@project_decomposition([aten.__lshift__.Tensor, aten.__lshift__.Scalar])
def lshift(self, other):
    return bitwise_left_shift(self, other)


@project_decomposition([aten.__rshift__.Tensor, aten.__rshift__.Scalar])
def rshift(self, other):
    return bitwise_right_shift(self, other)


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
    # NOTE: a cycle through prims.exp2 otherwise. Not pow.Scalar(2, x) either: the refs (a
    # prims opset's tables) lower that to exp2 again. pow.Tensor_Tensor with a 0-dim base is
    # what eager's pow.Scalar runs (a wrapped scalar tensor), core, and prims.pow under the refs.
    # Integers and bools promote to the default float dtype first, as exp2's type promotion does.
    if not (self.dtype.is_floating_point or self.dtype.is_complex):
        self = aten._to_copy.default(self, dtype=torch.get_default_dtype())
    two = aten.scalar_tensor.default(2, dtype=self.dtype, device=self.device)
    return aten.pow.Tensor_Tensor(two, self)


def _torch_decomposition(op):
    from torch._decomp import decomposition_table

    return decomposition_table[op]


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
