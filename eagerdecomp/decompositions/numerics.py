"""Numeric helpers the decompositions share: the type kernels compute in, and values rounded
as a kernel's C++ rounds them.

Example::

    >>> import torch
    >>> from eagerdecomp.decompositions.numerics import opmath, to_float32
    >>> opmath(torch.bfloat16), opmath(torch.float64)
    (torch.float32, torch.float64)
    >>> to_float32(0.1) == 0.1
    False
"""

from __future__ import annotations

import math
import struct

import torch
from torch._prims_common import get_computation_dtype

__all__ = ["opmath", "to_opmath", "cast", "to_float32"]

aten = torch.ops.aten
_F32 = struct.Struct("f")


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The type CPU kernels compute ``dtype`` in (``at::opmath_type``): float32 for the 16-bit
    floats, complex64 for complex32, the type itself otherwise."""
    return get_computation_dtype(dtype)


def cast(t, dtype):
    """``t`` as ``dtype`` (itself when it already is)."""
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def to_opmath(t):
    """``t`` in the type its kernels compute in."""
    return cast(t, opmath(t.dtype))


def to_float32(v: float) -> float:
    """``v`` rounded to float32 (inf past its range), as a kernel's ``Scalar.to<float>()`` rounds it."""
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:  # struct may refuse a value past float32's range instead of rounding it
        return math.copysign(math.inf, v)
