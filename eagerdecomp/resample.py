"""Bilinear and bicubic resizing of uint8 images: declined, for want of an exact path.

NOTE: eager's CPU kernel resizes uint8 input with fixed-point weights (int16, a precision
chosen per call) on its vectorized path, which it takes or not by CPU capability and by
channel count; PyTorch's decompositions compute in float and round (bilinear), or emulate
one of those paths (bicubic, through shifts no core op has). Either may differ from eager
by one level, so these calls have no path here: an UnsupportedOpError, never a near miss.
Float inputs keep PyTorch's decompositions (and antialias.py's).
"""

from __future__ import annotations

import functools

import torch

from .registry import project_decomposition

aten = torch.ops.aten


def _decline_uint8(op):
    from torch._decomp import decomposition_table

    inner = decomposition_table[op]

    @functools.wraps(inner)
    def resize(input, *args, **kwargs):
        if input.dtype == torch.uint8:
            return NotImplemented
        return inner(input, *args, **kwargs)

    return resize


for _op in (aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.default, aten.upsample_bicubic2d.vec):
    project_decomposition(_op)(_decline_uint8(_op))
