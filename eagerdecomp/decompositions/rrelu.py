"""rrelu_with_noise (F.rrelu, nn.RReLU) in core ops, drawing eager's own random numbers.

NOTE: PyTorch has no decomposition for these. In training, eager's CPU kernel walks the input in
row-major order and, for each element <= 0 (NaN is not), draws one double from
uniform(lower, upper) (53 random bits, times (upper - lower), plus lower: two roundings),
converts it to the op's math type (float for float32 and the 16-bit types), writes it to
``noise`` and the product with the element to the output; other elements get noise 1 and pass
through. Core ``rand`` in float64 draws the same 53-bit numbers from the same generator, one per
element in order (lower and upper are first rounded to the math type, as eager's Scalar.to does),
so drawing exactly as many as there are elements <= 0 (a count read from the
data: such calls run on the bypass path) and placing them by rank reproduces eager's numbers and
leaves the generator where eager leaves it. Out of training it is leaky_relu with the slope
(lower + upper) / 2 computed in double, as eager. ``noise`` is written through its data pointer in
eager, so a non-contiguous one (whose layout that ignores) is declined, as is an explicit
``generator=`` (core ``rand`` takes none).
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.numerics import opmath, to_float32
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_F64 = torch.float64


def _asopmath(v, dtype) -> float:
    if opmath(dtype) == torch.float32:
        return to_float32(float(v))
    return float(v)


def _values(self, lower, upper):
    """(output, noise) values, row-major, in self's dtype."""
    dtype = self.dtype
    flat = aten.reshape.default(self, [-1])
    hit = aten.le.Scalar(flat, 0)
    count = int(aten._local_scalar_dense.default(aten.sum.default(hit, dtype=torch.int64))) if flat.numel() else 0
    if count == 0:
        return flat, aten.ones_like.default(flat)
    u = aten.rand.default([count], dtype=_F64, device=self.device)
    lo, hi = (_asopmath(v, dtype) for v in (lower, upper))  # Scalar.to<opmath_t>(), then widened
    r = aten.add.Tensor(aten.mul.Tensor(u, hi - lo), lo)
    r = aten._to_copy.default(r, dtype=opmath(dtype))
    rank = aten.clamp.default(aten.sub.Tensor(aten.cumsum.default(hit, 0, dtype=torch.int64), 1), 0)
    r_at = aten.index.Tensor(r, [rank])
    product = aten.mul.Tensor(aten._to_copy.default(flat, dtype=opmath(dtype)), r_at)
    out = aten.where.self(hit, aten._to_copy.default(product, dtype=dtype), flat)
    noise = aten.where.self(hit, aten._to_copy.default(r_at, dtype=dtype), aten.ones_like.default(flat))
    return out, noise


def _declined(self, noise, generator, training) -> bool:
    return (
        generator is not None
        or not self.dtype.is_floating_point
        or (training and noise.numel() > 1 and not noise.is_contiguous())
    )


def _check(self, noise):
    if list(self.shape) != list(noise.shape):
        raise RuntimeError(
            f"noise tensor shape must match self tensor shape. Got self.shape = {list(self.shape)} "
            f"noise.shape = {list(noise.shape)}"
        )


def _slope(lower, upper):
    return (float(lower) + float(upper)) / 2  # eager: (scalar_to_tensor(lower) + ...) / 2, in double


@project_decomposition(aten.rrelu_with_noise.default)
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    if _declined(self, noise, generator, training):
        return NotImplemented
    _check(self, noise)
    if not training:
        return aten.leaky_relu.default(self, _slope(lower, upper))
    out, values = _values(self, lower, upper)
    aten.copy_.default(noise, aten.view.default(values, list(noise.shape)))
    return aten.view.default(out, list(self.shape))  # eager's output is a fresh contiguous tensor


@project_decomposition(aten.rrelu_with_noise_.default)
def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    if _declined(self, noise, generator, training):
        return NotImplemented
    _check(self, noise)
    if not training:
        return aten.copy_.default(self, aten.leaky_relu.default(self, _slope(lower, upper)))
    out, values = _values(self, lower, upper)
    aten.copy_.default(noise, aten.view.default(values, list(noise.shape)))
    return aten.copy_.default(self, aten.view.default(out, list(self.shape)))
