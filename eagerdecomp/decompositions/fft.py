"""The complex FFT from Core ATen's two real ones.

Core ATen keeps ``_fft_r2c`` and ``_fft_c2r`` but not ``_fft_c2c``, which ``fft2``,
``fftn``, ``ifftn`` and friends reach for every dim after the first (on real input too:
the first transform makes it complex). A transform is linear, so the complex one is two
real ones: FFT(a + ib) = FFT(a) + i FFT(b), each a full (two-sided) ``_fft_r2c``.
"""

from __future__ import annotations

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
