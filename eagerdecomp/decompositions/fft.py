"""The complex FFT from Core ATen's two real ones.

Core ATen keeps ``_fft_r2c`` and ``_fft_c2r`` but not ``_fft_c2c``, which ``fft2``,
``fftn``, ``ifftn`` and friends reach for every dim after the first (on real input too:
the first transform makes it complex). A transform is linear, so the complex one is two
real ones: FFT(a + ib) = FFT(a) + i FFT(b), each a full (two-sided) ``_fft_r2c``.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


# NOTE: the real part of a complex tensor without a cast: ``_to_copy`` to a real dtype would
# do it but warns that it discards the imaginary part; a length-1 inverse real FFT is the
# real part of its one element, exactly (no arithmetic: the scale is 1).
def _real(z):
    one = aten.unsqueeze.default(z, -1)
    return aten.squeeze.dim(aten._fft_c2r.default(one, [z.dim()], 0, 1), -1)


def _imag(z):
    # Re(-i z) = Im(z): the complex product adds Re(z) * 0 (NaN where Re(z) is infinite; an
    # FFT of such an input is NaN there natively too)
    return _real(aten.mul.Tensor(z, -1j))


def _reverse_frequencies(x, dims):
    """x[k] -> x[-k mod n] along each dim: an unnormalized inverse DFT is the forward one at -k."""
    for d in dims:
        n = x.shape[d]
        if n > 1:
            tail = aten.flip.default(aten.slice.Tensor(x, d, 1, n), [d])
            x = aten.cat.default([aten.slice.Tensor(x, d, 0, 1), tail], d)
    return x


# NOTE: both halves use the r2c transform, so the rounding is that of a native real FFT; the
# inverse reads the forward spectrum at -k rather than conjugating twice (a conjugate has no
# core-op form: ``_conj`` is a view that flips a bit). ``normalization`` scales by the
# transformed sizes in either direction, so it passes through unchanged. Compared with
# native c2c, values agree to FFT rounding (the conformance suite's complex tolerances).
@project_decomposition(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    if self.dtype not in (torch.complex64, torch.complex128):
        return NotImplemented  # complex32: no real half-precision FFT on CPU to build from
    if not dim:
        return aten.clone.default(self)
    dims = [d % self.dim() for d in dim]
    re = aten._fft_r2c.default(_real(self), dims, normalization, False)
    im = aten._fft_r2c.default(_imag(self), dims, normalization, False)
    out = aten.add.Tensor(re, aten.mul.Tensor(im, 1j))
    return out if forward else _reverse_frequencies(out, dims)


# -- prims opsets: the transforms as FFT prims -----------------------------------------------------


def _scale(x, normalization, n):
    """``x`` scaled as ``normalization`` asks (0: none, 1: by 1/sqrt(n), 2: by 1/n).

    NOTE: the FFT prims transform unnormalized (their ATen form passes normalization 0); eager
    scales inside its transform (MKL's scale setting, pocketfft's factor on the first pass), so
    values agree with eager's to FFT rounding, not bit for bit, as the c2c decomposition above."""
    if normalization == 0 or n == 1:
        return x
    return aten.mul.Tensor(x, 1.0 / (math.sqrt(n) if normalization == 1 else n))


# NOTE: the FFT prims' meta says a contiguous result, but their ATen form (the kernel the mode
# and edprims run) returns eager's layout, which for a transform over a leading dim is not
# contiguous ([5, 6, 7] over dim 0: strides (1, 35, 5)). A kernel traced over the meta then read
# the result through the meta's strides (the inverse's flip is an as_strided): wrong values on
# replay. The contiguous clone makes the result what the meta promised on any backend; the
# runtime gives the caller eager's layout afterwards, as for every op.
def _as_promised(y):
    return aten.clone.default(y, memory_format=torch.contiguous_format)


def fft_r2c(self, dim, normalization, onesided):
    n = math.prod(self.shape[d] for d in dim)
    y = torch.ops.prims.fft_r2c.default(self, dim=dim, onesided=onesided)
    return _scale(_as_promised(y), normalization, n)


def fft_c2r(self, dim, normalization, last_dim_size):
    n = math.prod(self.shape[d] for d in dim[:-1]) * last_dim_size
    y = torch.ops.prims.fft_c2r.default(self, dim=dim, last_dim_size=last_dim_size)
    return _scale(_as_promised(y), normalization, n)


# Core ATen keeps the two real transforms (and ``_fft_c2c`` lowers to them above); a prims opset
# reaches them through these (``table.default_table`` adds the entries for prims opsets only).
PRIMS_FFT = {aten._fft_r2c.default: fft_r2c, aten._fft_c2r.default: fft_c2r}
