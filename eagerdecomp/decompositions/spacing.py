"""linspace and logspace as eager's CPU kernels compute them, in core ops.

NOTE: torch's refs compute these in a wide type and round once; eager's CPU kernels round per
operation in a type that depends on the result dtype, so the two disagree at integer and 16-bit
results (by one at an integer, by an ulp of bfloat16 near 2**16). Here each kernel's arithmetic is
replayed operation by operation:

* linspace (cpu/RangeFactoriesKernel.cpp, a serial per-element loop): start and end are first
  converted to the result dtype (Scalar.to<T>: truncation for integers); the step is
  ``(end - start) / (steps - 1)`` in the step type (double for integer results, the result dtype
  otherwise, so 16-bit floats round after the subtraction and after the division by the step count,
  itself rounded to the 16-bit type); element ``i`` is ``start + step * i`` below ``steps // 2`` and
  ``end - step * (steps - 1 - i)`` from there. 16-bit arithmetic is float arithmetic rounded to
  the 16-bit type after each operation (c10::Half and c10::BFloat16 do exactly that). In float,
  double and integer results the kernel, built with FMA for the AVX2/AVX512 capabilities, contracts
  ``start + step * i`` into one fused multiply-add (measured: plain arithmetic differs from eager in
  most samples, the fused form in none); a correctly rounded fma is emulated with error-free
  transformations (Dekker's product, Knuth's two-sum) and Boldo and Melquiond's round-to-odd: for
  float32, the exact product in double, the sum rounded to odd, then rounded to float; for double,
  RN(th + RO(tl + pl)). Integer results truncate the double toward zero, as the kernel's cast does.
  On the DEFAULT capability (no FMA in that build) the plain arithmetic is replayed instead.
* logspace (RangeFactories.cpp, compiled without FMA): start and end in the result dtype, their
  difference in it (16-bit: rounded), then in double ``step = diff / (steps - 1)``, the exponent
  ``start + step * i`` (or ``end - step * (steps - 1 - i)``), ``pow(base, exponent)``, converted
  to the result dtype (16-bit floats through float, as c10's conversion does). ``steps == 1``
  fills ``pow(base, start)`` with start not converted first. The kernel's pow is the C library's;
  core ``pow`` on a CPU is SLEEF's in its vector lanes, which can differ from it by one double ulp
  (about 2% of arguments): float64 results can then differ by that ulp, narrower results only
  when it crosses their rounding boundary.

The Tensor overloads read their 0-dim start/end with ``item()`` in eager, then convert with
Scalar.to<T>(), which raises on overflow. Where that conversion cannot overflow (an int tensor into
a wider type, anything into float64...) the tensors are converted in the kernel, no data read;
otherwise (float to integer, double to float...) the value is read so that eager's error is raised,
and such calls run on the bypass path; so does logspace with one step (its fill_ of pow(base,
start) is a checked conversion too: computed with the C library's pow through Python's math.pow).
An out= whose numel is the step count keeps its shape in eager while its meta kernel resizes it to
[steps]: declined. Complex results or arguments (and bool, which eager refuses) keep torch's
decomposition; steps above 2**24 are declined (float32 indices stop being exact there).
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.pointwise import _exponent, _pow2
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.overlap import guard

aten = torch.ops.aten
_F64, _F32 = torch.float64, torch.float32
_HALF = (torch.float16, torch.bfloat16)
_MAX_STEPS = 2**24


def _cast(x, dtype):
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


def _fma_capable() -> bool:
    return torch.backends.cpu.get_cpu_capability() != "DEFAULT"


# -- error-free transformations and a correctly rounded fma in float64 -----------------------------
def _two_sum(a, b):
    s = aten.add.Tensor(a, b)
    z = aten.sub.Tensor(s, a)
    e = aten.add.Tensor(aten.sub.Tensor(a, aten.sub.Tensor(s, z)), aten.sub.Tensor(b, z))
    return s, e


def _split(a):  # Veltkamp: a = hi + lo, each with at most 26 significant bits
    g = aten.mul.Tensor(a, 134217729.0)
    hi = aten.sub.Tensor(g, aten.sub.Tensor(g, a))
    return hi, aten.sub.Tensor(a, hi)


def _two_prod(a, b):
    p = aten.mul.Tensor(a, b)
    ah, al = _split(a)
    bh, bl = _split(b)
    e = aten.sub.Tensor(aten.mul.Tensor(ah, bh), p)
    e = aten.add.Tensor(e, aten.mul.Tensor(ah, bl))
    e = aten.add.Tensor(e, aten.mul.Tensor(al, bh))
    return p, aten.add.Tensor(e, aten.mul.Tensor(al, bl))


def _round_odd(a, b):
    """a + b rounded to odd in float64: RN(a + b), moved one ulp toward the exact sum when that is
    inexact and the rounded significand is even."""
    u, err = _two_sum(a, b)
    mag = aten.abs.default(u)
    regular = aten.logical_and.default(aten.ne.Scalar(mag, 0.0), aten.lt.Scalar(mag, float("inf")))
    safe = aten.where.self(regular, mag, aten.ones_like.default(mag))
    e = aten.clamp.default(_exponent(safe), -1022.0)
    ulp = _pow2(aten.sub.Tensor(e, 52.0))
    odd = aten.eq.Scalar(aten.fmod.Scalar(aten.div.Tensor(safe, ulp), 2.0), 1.0)
    up = aten.gt.Scalar(err, 0.0)
    toward_zero = aten.ne.Tensor(up, aten.gt.Scalar(u, 0.0))
    power = aten.logical_and.default(aten.eq.Tensor(safe, _pow2(e)), aten.gt.Scalar(e, -1022.0))
    step = aten.where.self(aten.logical_and.default(toward_zero, power), aten.mul.Tensor(ulp, 0.5), ulp)
    moved = aten.add.Tensor(u, aten.where.self(up, step, aten.neg.default(step)))
    nudge = aten.logical_and.default(
        aten.logical_and.default(aten.ne.Scalar(err, 0.0), aten.logical_not.default(odd)), regular
    )
    return aten.where.self(nudge, moved, u)


def _fma64(a, b, c):
    """RN(a * b + c) in float64 (Boldo-Melquiond); the plain expression where it overflows."""
    ph, pl = _two_prod(a, b)
    th, tl = _two_sum(c, ph)
    out = aten.add.Tensor(th, _round_odd(tl, pl))
    plain = aten.add.Tensor(aten.mul.Tensor(a, b), c)
    return aten.where.self(aten.isfinite.default(out), out, plain)


def _fma32(a, b, c):
    """RN32(a * b + c) for float32 a, b, c: the product is exact in double, the sum rounded to odd."""
    p = aten.mul.Tensor(_cast(a, _F64), _cast(b, _F64))
    out = _cast(_round_odd(p, _cast(c, _F64)), _F32)
    plain = aten.add.Tensor(aten.mul.Tensor(a, b), c)
    return aten.where.self(aten.isfinite.default(out), out, plain)


# -- the two halves of the kernel's index ----------------------------------------------------------
def _indices(steps, device):
    i = aten.arange.start_step(0, steps, 1, dtype=torch.int64, device=device)
    k = aten.arange.start_step(steps - 1, -1, -1, dtype=torch.int64, device=device)  # steps - 1 - i
    low = aten.lt.Scalar(i, steps // 2)
    return i, k, low


# (destination, sources) pairs whose conversion can neither overflow nor raise: Scalar.to<T>()'s
# checked conversion is then the plain cast
_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_SAFE = {
    torch.float64: (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.bool) + _INTS,
    torch.float32: (torch.float32, torch.float16, torch.bfloat16, torch.bool) + _INTS,
    torch.bfloat16: (torch.bfloat16, torch.float16, torch.bool) + _INTS,
    torch.float16: (torch.float16, torch.bool, torch.int8, torch.uint8, torch.int16),
    torch.int64: (torch.bool,) + _INTS,
    torch.int32: (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32),
    torch.int16: (torch.bool, torch.int8, torch.uint8, torch.int16),
    torch.int8: (torch.bool, torch.int8),
    torch.uint8: (torch.bool, torch.uint8),
}


def _scalar_or_tensor(v, dtype):
    """A 0-dim start/end tensor stays a tensor (converted in the kernel, no data read) where its
    conversion to ``dtype`` is a plain cast; otherwise its value is read, as eager's item() does,
    so that Scalar.to<T>()'s overflow error (float to int, double to float...) is eager's."""
    if isinstance(v, torch.Tensor) and v.dtype not in _SAFE.get(dtype, ()):
        return aten._local_scalar_dense.default(v)
    return v


def _as_value(v, dtype, device):
    """A start/end argument as the kernel holds it: Scalar.to<T>() (0-dim, in ``dtype``)."""
    if isinstance(v, torch.Tensor):
        return aten._to_copy.default(v, dtype=dtype, device=device)
    return aten.scalar_tensor.default(v, dtype=dtype, device=device)


def _linspace_values(start, end, steps, dtype, device):
    s, e = _as_value(start, dtype, device), _as_value(end, dtype, device)
    if steps == 1:
        return aten.view.default(s, [1])
    i, k, low = _indices(steps, device)
    if dtype in _HALF:

        def r(x):  # one c10 16-bit operation: float arithmetic rounded to the 16-bit type
            return _cast(_cast(x, dtype), _F32)

        sf, ef = _cast(s, _F32), _cast(e, _F32)
        n = r(aten.scalar_tensor.default(float(steps - 1), dtype=_F32, device=device))
        step = r(aten.div.Tensor(r(aten.sub.Tensor(ef, sf)), n))
        fi, fk = r(_cast(i, _F32)), r(_cast(k, _F32))
        lo = r(aten.add.Tensor(sf, r(aten.mul.Tensor(step, fi))))
        hi = r(aten.sub.Tensor(ef, r(aten.mul.Tensor(step, fk))))
        return _cast(aten.where.self(low, lo, hi), dtype)
    wide = dtype if dtype in (_F32, _F64) else _F64  # the kernel's step type
    sw, ew = _cast(s, wide), _cast(e, wide)
    n = aten.scalar_tensor.default(float(steps - 1), dtype=wide, device=device)
    step = aten.div.Tensor(aten.sub.Tensor(ew, sw), n)
    fi, fk = _cast(i, wide), _cast(k, wide)
    if _fma_capable():
        fma = _fma32 if wide == _F32 else _fma64
        lo = fma(step, fi, sw)
        hi = fma(aten.neg.default(step), fk, ew)
    else:
        lo = aten.add.Tensor(sw, aten.mul.Tensor(step, fi))
        hi = aten.sub.Tensor(ew, aten.mul.Tensor(step, fk))
    return _cast(aten.where.self(low, lo, hi), dtype)  # integers: truncation toward zero


def _pow_scalar(base, x):
    """The C library's pow(base, x) (Python's math.pow calls it), or core pow where Python raises
    on a value C returns (an overflow, a negative base's fractional power, a pole)."""
    try:
        return math.pow(base, x)
    except (OverflowError, ValueError):
        y = aten.pow.Scalar(base, aten.scalar_tensor.default(x, dtype=_F64))
        return aten._local_scalar_dense.default(y)


def _logspace_values(start, end, steps, base, dtype, device):
    if steps == 1:  # fill_(pow(base, start.to<double>())): a checked conversion, so read and filled
        if isinstance(start, torch.Tensor):
            start = aten._local_scalar_dense.default(start)
        return aten.full.default([1], _pow_scalar(float(base), float(start)), dtype=dtype, device=device)
    s, e = _as_value(start, dtype, device), _as_value(end, dtype, device)
    if dtype in _HALF:
        diff = _cast(aten.sub.Tensor(_cast(e, _F32), _cast(s, _F32)), dtype)
    elif dtype in (torch.int8, torch.uint8, torch.int16):  # C promotes these to int first
        diff = aten.sub.Tensor(_cast(e, torch.int32), _cast(s, torch.int32))
    else:
        diff = aten.sub.Tensor(e, s)  # in the result dtype (int32/int64 wrap as the kernel's do)
    step = aten.div.Tensor(_cast(diff, _F64), aten.scalar_tensor.default(float(steps - 1), dtype=_F64, device=device))
    i, k, low = _indices(steps, device)
    lo = aten.add.Tensor(_cast(s, _F64), aten.mul.Tensor(step, _cast(i, _F64)))
    hi = aten.sub.Tensor(_cast(e, _F64), aten.mul.Tensor(step, _cast(k, _F64)))
    y = aten.pow.Scalar(float(base), aten.where.self(low, lo, hi))
    return _to_result(y, dtype)


def _to_result(y, dtype):
    if dtype in _HALF:
        y = _cast(y, _F32)  # c10's 16-bit types convert from double through float
    return _cast(y, dtype)


def _dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


def _theirs(start, end, dtype) -> bool:
    """Calls left to torch's decomposition, as before this module: complex results or arguments
    (not replayed here) and start/end tensors that are not 0-dim (its error)."""
    return (dtype is not None and dtype.is_complex) or any(
        isinstance(v, complex) or (isinstance(v, torch.Tensor) and (v.dtype.is_complex or v.dim() != 0))
        for v in (start, end)
    )


def _torch_decomposition(op):
    from torch._decomp import decomposition_table

    return decomposition_table[op]


def _check_steps(steps):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")


def _fill(compute, op, out_op):
    def functional(start, end, steps, *rest, dtype=None, layout=None, device=None, pin_memory=None):
        if _theirs(start, end, dtype):
            return _torch_decomposition(op)(
                start, end, steps, *rest, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory
            )
        dtype = _dtype(dtype)
        _check_steps(steps)
        if steps > _MAX_STEPS or dtype == torch.bool:  # bool: eager has no kernel (it raises)
            return NotImplemented
        device = device if device is not None else torch.device("cpu")
        if steps == 0:
            return aten.empty.memory_format([0], dtype=dtype, device=device)
        start, end = _scalar_or_tensor(start, dtype), _scalar_or_tensor(end, dtype)
        return compute(start, end, steps, *rest, dtype=dtype, device=device)

    def out_fill(start, end, steps, *rest, out):
        if _theirs(start, end, out.dtype):
            return _torch_decomposition(out_op)(start, end, steps, *rest, out=out)
        guard(out_op, op, [out], [[start, end]])
        _check_steps(steps)
        if steps > _MAX_STEPS or out.dtype == torch.bool or (out.numel() == steps and list(out.shape) != [steps]):
            return NotImplemented  # eager keeps such an out's shape, its meta kernel resizes it: declined
        if out.numel() != steps:  # the kernel's own resize_, without resize_output's warning
            out.resize_([steps])
        if steps == 0:
            return out
        start, end = _scalar_or_tensor(start, out.dtype), _scalar_or_tensor(end, out.dtype)
        values = compute(start, end, steps, *rest, dtype=out.dtype, device=out.device)
        return aten.copy_.default(out, aten.view.default(values, list(out.shape)))

    return functional, out_fill


def _linspace(start, end, steps, *, dtype, device):
    return _linspace_values(start, end, steps, dtype, device)


def _logspace(start, end, steps, base=10.0, *, dtype, device):
    return _logspace_values(start, end, steps, base, dtype, device)


def _register(packet, compute):
    for name in ("default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        op, out_op = getattr(packet, name), getattr(packet, "out" if name == "default" else name + "_out")
        functional, out_fill = _fill(compute, op, out_op)
        project_decomposition(op)(functional)
        project_decomposition(out_op)(out_fill)


_register(aten.linspace, _linspace)
_register(aten.logspace, _logspace)
