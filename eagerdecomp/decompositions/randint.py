"""Integer draws (``random_``, ``randint``, ``randint_like``) from the bits eager's kernel takes.

The CPU kernels (ATen's ``cpu/DistributionTemplates.h`` over ``core/DistributionsHelper.h``)
take one generator output per element, in the memory order of the tensor they fill: a 32-bit
output (``random()``), or a 64-bit one (``random64()``, two 32-bit outputs) where the dtype is
64 bits wide with no range, or the range is 2**32 or wider for int64, float64, float32 and
bfloat16; the element is ``bits % range + from`` (``bits & 1`` for bool).

Core ATen has no op that hands out a generator's raw bits. ``rand`` shows part of them: a
float32 ``rand`` is a 32-bit output's low 24 bits over 2**24, a float64 one a 64-bit output's
low 53 bits over 2**53, and each consumes exactly the outputs eager's draw consumes. So:

* **eager's numbers** where the range divides 2**24 (a 32-bit draw) or 2**53 (a 64-bit draw):
  ``bits % range`` only reads the bits ``rand`` shows. That is bool, uint8, int8 and int16 with
  no range, and every power-of-two range (``random_(0, 2**k)``, ``randint(0, 2, ...)``);
* **a 64-bit draw** over another range consumes what eager's does (the generator ends where
  eager's does, so every later draw is eager's) and takes the low 53 bits modulo the range;
  where the range is wider than 2**53 (int64's and float64's full ranges, the DataLoader's
  seed), the bits no core op shows (53 and up) repeat bits 42 and up. The low 53 bits are
  eager's: the seed of a ``torch.Generator`` (its low 32 bits) made from such a draw is
  eager's, so a shuffled DataLoader's order is eager's;
* **a 32-bit draw** over a range of at most 2**12 takes the low 24 bits modulo the range (the
  generator again ends where eager's does; each value's odds are within range/2**24 of
  uniform's); over a wider one (int32's range, float16's 2049...) 24 bits are too few, so it
  takes a float64 draw: two outputs where eager takes one, another stream.

``STREAM_DIFFERS`` in :mod:`.rng` says so in the report.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.decompositions.rng import _DIGITS, _draw, _fresh
from eagerdecomp.ops.checks import checks_for

__all__ = ["eager_range"]

aten = torch.ops.aten

_WIDE_DTYPES = (torch.int64, torch.float64, torch.float32, torch.bfloat16)  # may take 64-bit draws
_NARROW_SPREAD = 2**12  # widest non-dividing range a 32-bit draw's 24 visible bits serve
_INT64_MIN = -(2**63)


def _round_to(n: int, digits: int) -> int:
    """``n`` rounded to ``digits`` significant bits, to nearest even (C++'s int64 -> float cast)."""
    m = abs(n)
    shift = m.bit_length() - digits
    if shift <= 0:
        return n
    q, r = divmod(m, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return (q << shift) * (1 if n >= 0 else -1)


def _update_from(from_: int, digits: int) -> int:
    # eager's update_from: a from the dtype rounds below itself moves up to the next it holds
    plus_1 = _round_to(from_ + 1, digits)
    if plus_1 < from_:
        n = abs(from_ + 1).bit_length() - 1
        from_ = plus_1 + (1 << (n - digits + 1))
    return from_


def _update_to(to: int, digits: int) -> int:
    # eager's update_to: a to the dtype rounds above itself moves down to the previous it holds
    minus_1 = _round_to(to - 1, digits)
    if minus_1 >= to:
        n = abs(to - 1).bit_length() - 1
        to = minus_1 - (1 << (n - digits + 1))
    return to


def eager_range(dtype, from_=None, to=None):
    """``(bits, range, base)`` of eager's CPU draw: ``random_()`` (both None), ``random_(from_,
    to)`` (``to`` None: up to the dtype's largest value). ``bits`` is 32 or 64, ``range`` is
    2**64 for int64's full range."""
    floating = dtype.is_floating_point
    if from_ is None:  # random_(): uniform_int_distribution
        if dtype == torch.bool:
            return 32, 2, 0
        if floating:
            return (64 if dtype == torch.float64 else 32), 2 ** _DIGITS[dtype] + 1, 0
        return (64 if dtype == torch.int64 else 32), torch.iinfo(dtype).max + 1, 0
    if to is None and from_ == _INT64_MIN:  # random_full_64_bits_range
        return 64, 2**64, _INT64_MIN
    if to is not None:
        if floating:
            from_, to = _update_from(from_, _DIGITS[dtype]), _update_to(to, _DIGITS[dtype])
        span = to - from_
    else:
        if floating:
            top = 2 ** _DIGITS[dtype]
            from_ = _update_from(from_, _DIGITS[dtype])
        else:
            top = 1 if dtype == torch.bool else torch.iinfo(dtype).max
        span = top - from_ + 1
    return (64 if dtype in _WIDE_DTYPES and span >= 2**32 else 32), span, from_


# the C++ type names eager's bounds messages print (caffe2::TypeMeta), for the dtypes whose
# bounds an int64 can pass
_TYPE_NAMES = {
    torch.bool: "bool",
    torch.uint8: "unsigned char",
    torch.int8: "signed char",
    torch.int16: "short int",
    torch.int32: "int",
    torch.float16: "c10::Half",
}


def _in_range(value: int, name: str, dtype) -> None:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        low, high = info.min, info.max
    elif dtype == torch.bool:
        low, high = 0, 1
    else:
        low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    if not low <= value <= high:
        raise RuntimeError(f"{name} is out of bounds for {_TYPE_NAMES.get(dtype, dtype)}")


# NOTE: eager's bounds checks (random_from_to_impl) are its kernel's, not its meta kernel's:
# made here before anything is drawn, with its messages. (Its warning that a floating bound
# past 2**digits is imprecise is not raised.)
def _bounds(dtype, from_, to=None) -> None:
    if to is not None:
        if from_ >= to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
        if dtype.is_floating_point:
            from_, to = _update_from(from_, _DIGITS[dtype]), _update_to(to, _DIGITS[dtype])
            if from_ >= to:
                raise RuntimeError(
                    "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, "
                    f"but got from={from_} >= to={to}"
                )
        _in_range(from_, "from", dtype)
        _in_range(to - 1, "to - 1", dtype)
    elif from_ != _INT64_MIN:
        if dtype.is_floating_point:
            to_inc = 2 ** _DIGITS[dtype]
            from_ = _update_from(from_, _DIGITS[dtype])
            if from_ >= to_inc:
                raise RuntimeError(
                    "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to "
                    f"dtype, but got from={from_} > to_inc={to_inc}"
                )
        else:
            to_inc = 1 if dtype == torch.bool else torch.iinfo(dtype).max
        _in_range(from_, "from", dtype)
        _in_range(to_inc, "to - 1", dtype)


@checks_for("aten::random_.from", "aten::random.from", "aten::random.from_out")
def _random_from(self, from_, to=None, *, generator=None, out=None):
    _bounds(self.dtype, from_, to)


@checks_for(aten.random_.to, aten.random.to, aten.random.to_out)
def _random_to(self, to, *, generator=None, out=None):
    _bounds(self.dtype, 0, to)


@checks_for(aten.randint.default, aten.randint.generator)
def _randint(high, size, *, generator=None, dtype=None, **_):
    _bounds(torch.int64 if dtype is None else dtype, 0, high)


@checks_for(aten.randint.low, aten.randint.low_generator)
def _randint_low(low, high, size, *, generator=None, dtype=None, **_):
    _bounds(torch.int64 if dtype is None else dtype, low, high)


@checks_for(aten.randint_like.default, aten.randint_like.generator)
def _randint_like(self, high, *, generator=None, dtype=None, **_):
    _bounds(dtype or self.dtype, 0, high)


@checks_for(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype)
def _randint_like_low(self, low, high, *, generator=None, dtype=None, **_):
    _bounds(dtype or self.dtype, low, high)


def _bits(like, n, device=None, generator=None):
    """The low ``n`` (24 or 53) bits of one generator output per element of ``like`` (a tensor,
    filled in its memory order, or a size, filled contiguously), as int64."""
    float_type = torch.float32 if n == 24 else torch.float64
    if isinstance(like, torch.Tensor):
        u = _draw(aten.rand.default, like, float_type, device, generator)
    else:
        u = _fresh(aten.rand.default, like, generator, dtype=float_type, device=device)
    return aten._to_copy.default(aten.mul.Tensor(u, float(2**n)), dtype=torch.int64)


def _wide(low, span):
    """A value for a 64-bit draw over ``span`` > 2**53 from its low 53 bits: the bits above repeat
    bits 42 and up (no core op shows the real ones), then eager's ``bits % span``."""
    high = aten.bitwise_and.Scalar(aten.div.Tensor_mode(low, 2**42, rounding_mode="floor"), 2**11 - 1)
    if span == 2**64:  # the whole int64 range: the 64 bits as a signed number
        high = aten.sub.Tensor(high, aten.mul.Tensor(aten.ge.Scalar(high, 2**10), 2**11))
        return aten.add.Tensor(aten.mul.Tensor(high, 2**53), low)
    bits63 = aten.add.Tensor(aten.mul.Tensor(aten.bitwise_and.Scalar(high, 2**10 - 1), 2**53), low)
    if span < 2**63:
        return aten.remainder.Scalar(bits63, span)
    # NOTE: 2**63 (int64's random_()) is bits63 itself; a wider span (random_ from a negative from
    # to past 2**62) is less than two 63-bit spans: bits63 % span is bits63 too, the rest of the
    # span is never drawn
    return bits63


def draw_ints(like, from_=None, to=None, dtype=None, device=None, generator=None):
    """Eager's integers for ``like`` (a tensor, or a size with ``dtype``; see the module
    docstring for when they are its numbers)."""
    dtype = dtype or like.dtype
    bits, span, base = eager_range(dtype, from_, to)
    if bits == 32 and (2**24 % span == 0 or span <= _NARROW_SPREAD):
        value = aten.remainder.Scalar(_bits(like, 24, device, generator), span)
    elif span <= 2**53:
        value = aten.remainder.Scalar(_bits(like, 53, device, generator), span)
    else:
        value = _wide(_bits(like, 53, device, generator), span)
    if base:
        value = aten.add.Tensor(value, base)
    return aten._to_copy.default(value, dtype=dtype)


def _declines(like, memory_format=None) -> bool:
    return like.dtype.is_complex or memory_format not in (None, torch.preserve_format)


@project_decomposition(aten.random.default)
def random(self, *, generator=None):
    if _declines(self) or self.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return NotImplemented  # (eager's kernel has none of them)
    return draw_ints(self, generator=generator)


@project_decomposition(aten.random.to)
def random_to(self, to, *, generator=None):
    if _declines(self):
        return NotImplemented
    return draw_ints(self, 0, to, generator=generator)


@project_decomposition("aten::random.from")
def random_from(self, from_, to=None, *, generator=None):
    if _declines(self):
        return NotImplemented
    return draw_ints(self, from_, to, generator=generator)


@project_decomposition([aten.randint_like.default, aten.randint_like.generator])
def randint_like(
    self, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    if _declines(self, memory_format):
        return NotImplemented
    return draw_ints(self, 0, high, dtype, device, generator)


@project_decomposition([aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype])
def randint_like_low(
    self, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    if _declines(self, memory_format):
        return NotImplemented
    return draw_ints(self, low, high, dtype, device, generator)


@project_decomposition([aten.randint.default, aten.randint.generator])
def randint(high, size, *, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return randint_low(0, high, size, generator=generator, dtype=dtype, device=device)


@project_decomposition([aten.randint.low, aten.randint.low_generator])
def randint_low(low, high, size, *, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    # eager: empty(size, dtype).random_(low, high), a contiguous fill
    return draw_ints(list(size), low, high, torch.int64 if dtype is None else dtype, device, generator)
