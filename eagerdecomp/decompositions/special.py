"""Special functions written in core ops, evaluated in float64 and rounded once to the result dtype.

NOTE: no decomposition in PyTorch reaches these (its refs call prims that have no core-op
form). Each is the textbook method for its function (Lanczos, recurrence plus asymptotic
series, rational initial guess plus Newton steps, power and asymptotic series) evaluated in
float64: for float32 and 16-bit floats the result is the correctly rounded value up to
float64's own error, closer than the native single-precision kernels; for float64 the
relative error is a few units in the last place away from poles and zeros. These are
approximations under the conformance accuracy rule (error against a float64 reference no
worse than the native kernel's plus a small tolerance); dtypes and shapes are eager's.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_F64 = torch.float64


def _result_dtype(x):
    return x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()


def _supported(x) -> bool:
    return x.dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )


def _f64(x):
    return aten._to_copy.default(x, dtype=_F64)


def _out(y, x):
    return aten._to_copy.default(y, dtype=_result_dtype(x))


def _c(value, like):
    return aten.full_like.default(like, value)


def _where(cond, a, b):
    return aten.where.self(cond, a, b)


def _poly(coeffs, z):
    """Horner's rule, highest coefficient first."""
    acc = _c(coeffs[0], z)
    for c in coeffs[1:]:
        acc = aten.add.Tensor(aten.mul.Tensor(acc, z), c)
    return acc


def _frac_to_nearest(x):
    """``x - round(x)`` (exact in float64): reduces sin(pi x) and tan(pi x) to |r| <= 1/2."""
    return aten.sub.Tensor(x, aten.round.default(x))


# -- lgamma: Lanczos (g = 7, 9 terms) for x >= 1/2, the reflection formula below ------------------
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _lgamma_pos(x):  # x >= 1/2
    z = aten.sub.Tensor(x, 1.0)
    series = _c(_LANCZOS[0], z)
    for i, c in enumerate(_LANCZOS[1:], 1):
        series = aten.add.Tensor(series, aten.div.Tensor(_c(c, z), aten.add.Tensor(z, float(i))))
    t = aten.add.Tensor(z, 7.5)
    out = aten.mul.Tensor(aten.add.Tensor(z, 0.5), aten.log.default(t))
    return aten.add.Tensor(aten.add.Tensor(aten.sub.Tensor(out, t), _HALF_LOG_2PI), aten.log.default(series))


def _lgamma64(x):
    small = aten.lt.Scalar(x, 0.5)
    pos = _lgamma_pos(_where(small, aten.rsub.Scalar(x, 1.0), x))
    sin = aten.abs.default(aten.sin.default(aten.mul.Tensor(_frac_to_nearest(x), math.pi)))
    reflected = aten.sub.Tensor(aten.log.default(aten.div.Tensor(_c(math.pi, x), sin)), pos)
    out = _where(small, reflected, pos)
    return _where(aten.isinf.default(x), _c(math.inf, x), out)  # lgamma(+-inf) = inf


@project_decomposition(aten.lgamma.default)
def lgamma(self):
    if not _supported(self):
        return NotImplemented
    return _out(_lgamma64(_f64(self)), self)


# -- digamma: recurrence up to x + 10, asymptotic series there; reflection for x < 0 -------------
_DIGAMMA_ASYMPTOTIC = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)  # B_2k / 2k


def _digamma_pos(x):  # x > 0
    shift = aten.zeros_like.default(x)
    for k in range(10):
        shift = aten.add.Tensor(shift, aten.reciprocal.default(aten.add.Tensor(x, float(k))))
    z = aten.add.Tensor(x, 10.0)
    w = aten.reciprocal.default(aten.mul.Tensor(z, z))
    tail = aten.mul.Tensor(w, _poly(list(reversed(_DIGAMMA_ASYMPTOTIC)), w))
    psi = aten.sub.Tensor(aten.sub.Tensor(aten.log.default(z), aten.div.Tensor(_c(0.5, z), z)), tail)
    return aten.sub.Tensor(psi, shift)


def _digamma64(x):
    negative = aten.lt.Scalar(x, 0)
    pos = _digamma_pos(_where(negative, aten.rsub.Scalar(x, 1.0), x))
    tan = aten.tan.default(aten.mul.Tensor(_frac_to_nearest(x), math.pi))
    out = _where(negative, aten.sub.Tensor(pos, aten.div.Tensor(_c(math.pi, x), tan)), pos)
    # eager: digamma(+-0) = -+inf, NaN at the negative integers (poles)
    zero = aten.eq.Scalar(x, 0)
    signed_inf = _where(aten.lt.Scalar(aten.reciprocal.default(x), 0), _c(math.inf, x), _c(-math.inf, x))  # 1/-0 = -inf
    out = _where(zero, signed_inf, out)
    pole = aten.logical_and.default(negative, aten.eq.Tensor(x, aten.floor.default(x)))
    return _where(pole, _c(math.nan, x), out)


@project_decomposition(aten.digamma.default)
def digamma(self):
    if not _supported(self):
        return NotImplemented
    return _out(_digamma64(_f64(self)), self)


# -- erfinv: a rational first guess (central and tail forms), then two Newton steps on erf -------
_ERFINV_A = (-0.140543331, 0.914624893, -1.645349621, 0.886226899)
_ERFINV_B = (0.012229801, -0.329097515, 1.442710462, -2.118377725, 1.0)
_ERFINV_C = (1.641345311, 3.429567803, -1.624906493, -1.970840454)
_ERFINV_D = (1.637067800, 3.543889200, 1.0)
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)


def _erfinv64(x):
    a = aten.abs.default(x)
    z = aten.mul.Tensor(x, x)
    central = aten.div.Tensor(aten.mul.Tensor(x, _poly(_ERFINV_A, z)), _poly(_ERFINV_B, z))
    t = aten.sqrt.default(
        aten.neg.default(
            aten.log.default(aten.div.Tensor(aten.rsub.Scalar(aten.clamp.default(a, None, 1.0), 1.0), 2.0))
        )
    )
    tail = aten.mul.Tensor(aten.sign.default(x), aten.div.Tensor(_poly(_ERFINV_C, t), _poly(_ERFINV_D, t)))
    y = _where(aten.le.Scalar(a, 0.7), central, tail)
    for _ in range(2):
        step = aten.div.Tensor(
            aten.sub.Tensor(aten.erf.default(y), x),
            aten.mul.Tensor(aten.exp.default(aten.neg.default(aten.mul.Tensor(y, y))), _TWO_OVER_SQRT_PI),
        )
        y = aten.sub.Tensor(y, step)
    y = _where(aten.eq.Scalar(a, 1.0), aten.mul.Tensor(aten.sign.default(x), math.inf), y)
    return _where(aten.gt.Scalar(a, 1.0), _c(math.nan, x), y)


@project_decomposition(aten.erfinv.default)
def erfinv(self):
    if not _supported(self):
        return NotImplemented
    return _out(_erfinv64(_f64(self)), self)


# -- modified Bessel functions I0, I1 (and exponentially scaled): power series for |x| <= 15,
# the large-argument asymptotic series above it ------------------------------------------------
_SERIES_TERMS = 60
_ASYMPTOTIC_TERMS = 14


def _bessel_i_series(x, nu):
    """sum_k (x/2)^(2k+nu) / (k! (k+nu)!), terms built by their ratio."""
    half = aten.mul.Tensor(x, 0.5)
    q = aten.mul.Tensor(half, half)
    term = half if nu == 1 else aten.ones_like.default(x)
    total = term
    for k in range(1, _SERIES_TERMS):
        term = aten.div.Tensor(aten.mul.Tensor(term, q), float(k * (k + nu)))
        total = aten.add.Tensor(total, term)
    return total


def _bessel_i_asymptotic_scaled(a, nu):
    """e^-a I_nu(a) for large a > 0: (2 pi a)^-1/2 sum_k (-1)^k prod_j (4nu^2 - (2j-1)^2) / (k! (8a)^k)."""
    mu = 4.0 * nu * nu
    inv = aten.reciprocal.default(aten.mul.Tensor(a, 8.0))
    term = aten.ones_like.default(a)
    total = term
    for k in range(1, _ASYMPTOTIC_TERMS):
        term = aten.mul.Tensor(aten.mul.Tensor(term, inv), -(mu - (2 * k - 1) ** 2) / k)
        total = aten.add.Tensor(total, term)
    return aten.mul.Tensor(total, aten.rsqrt.default(aten.mul.Tensor(a, 2 * math.pi)))


def _bessel_i64(x, nu, scaled):
    a = aten.abs.default(x)
    large = aten.gt.Scalar(a, 20.0)
    series = _bessel_i_series(_where(large, aten.zeros_like.default(x), x), nu)  # odd for nu = 1
    if scaled:
        series = aten.mul.Tensor(series, aten.exp.default(aten.neg.default(a)))
    safe = _where(large, a, _c(21.0, a))
    asym = _bessel_i_asymptotic_scaled(safe, nu)
    if not scaled:
        asym = aten.mul.Tensor(asym, aten.exp.default(safe))
    if nu == 1:
        asym = aten.mul.Tensor(asym, aten.sign.default(x))
    return _where(large, asym, series)


def _bessel(nu, scaled, half_floats=True):
    def fill(self):
        if not _supported(self) or (not half_floats and self.dtype in (torch.float16, torch.bfloat16)):
            return NotImplemented  # no native kernel at these dtypes: eager raises, so no path
        return _out(_bessel_i64(_f64(self), nu, scaled), self)

    return fill


for _op, _nu, _scaled, _half in (
    (aten.i0.default, 0, False, True),
    (aten.special_i0e.default, 0, True, True),
    (aten.special_i1.default, 1, False, True),
    (aten.special_i1e.default, 1, True, True),
    (aten.special_modified_bessel_i0.default, 0, False, False),
    (aten.special_modified_bessel_i1.default, 1, False, False),
):
    project_decomposition(_op)(_bessel(_nu, _scaled, _half))


# -- erfc and erfcx: 1 - erf(x) where that loses nothing (x < 2, erfc >= 0.0046), Laplace's
# continued fraction x + (1/2)/(x + 1/(x + (3/2)/(x + ...))) for x >= 2, evaluated bottom-up
# to a fixed depth; erfc(-x) = 2 - erfc(x) ------------------------------------------------------
_CF_DEPTH = 80
_SQRT_PI = math.sqrt(math.pi)


def _erfc_fraction(x):  # x >= 2: erfc(x) = exp(-x^2) / (sqrt(pi) * fraction)
    f = aten.clone.default(x)
    for k in range(_CF_DEPTH, 0, -1):
        f = aten.add.Tensor(x, aten.div.Tensor(_c(k / 2, x), f))
    return aten.mul.Tensor(f, _SQRT_PI)


def _erfc64(x, scaled):
    a = aten.abs.default(x)
    far = aten.ge.Scalar(a, 2.0)
    fraction = _erfc_fraction(_where(far, a, _c(2.0, a)))
    x2 = aten.mul.Tensor(a, a)
    if scaled:  # erfcx(|x|) = exp(x^2) erfc(|x|)
        near = aten.mul.Tensor(aten.exp.default(x2), aten.rsub.Scalar(aten.erf.default(a), 1.0))
        pos = _where(far, aten.reciprocal.default(fraction), near)
        neg = aten.sub.Tensor(aten.mul.Tensor(aten.exp.default(x2), 2.0), pos)  # erfcx(-x) = 2 e^(x^2) - erfcx(x)
    else:
        near = aten.rsub.Scalar(aten.erf.default(a), 1.0)
        pos = _where(far, aten.div.Tensor(aten.exp.default(aten.neg.default(x2)), fraction), near)
        neg = aten.rsub.Scalar(pos, 2.0)
    out = _where(aten.lt.Scalar(x, 0), neg, pos)
    if scaled:  # erfcx(+inf) = 0 (the fraction is inf there), erfcx(-inf) = inf
        out = _where(aten.eq.Scalar(x, math.inf), _c(0.0, x), out)
    return out


@project_decomposition(aten.erfc.default)
def erfc(self):
    if not _supported(self):
        return NotImplemented
    return _out(_erfc64(_f64(self), scaled=False), self)


@project_decomposition(aten.special_erfcx.default)
def erfcx(self):
    if not _supported(self) or self.dtype in (torch.float16, torch.bfloat16):
        return NotImplemented  # no native kernel at 16-bit floats: eager raises
    return _out(_erfc64(_f64(self), scaled=True), self)


# -- spherical_bessel_j0: sin(x) / x ---------------------------------------------------------------
# NOTE: j0(x) = sin(x)/x, 1 at 0 and 0 at +-inf (NaN stays NaN), evaluated in float64 and rounded
# once. Near 0 the kernel uses the Taylor series (|x| < 1/2); sin(x)/x in float64 is as accurate
# there (sin is correctly rounded to an ulp and no cancellation occurs).
@project_decomposition(aten.special_spherical_bessel_j0.default)
def special_spherical_bessel_j0(self):
    if not _supported(self) or self.dtype in (torch.float16, torch.bfloat16):  # no 16-bit kernel in eager
        return NotImplemented
    x = _f64(self)
    y = aten.div.Tensor(aten.sin.default(x), x)
    y = _where(aten.eq.Scalar(x, 0.0), _c(1.0, x), y)
    y = _where(aten.isinf.default(x), _c(0.0, x), y)
    return _out(y, self)


# -- ndtri: the standard normal quantile ------------------------------------------------------------
# NOTE: ndtri(p) = sqrt(2) erfinv(2p - 1). In the centre (|p - 1/2| <= 1/4, where 2p - 1 is exact)
# that is the erfinv decomposition; in the tails 2p - 1 would lose p's digits, so t = erfcinv(2q), q the
# smaller of p and 1 - p (exact), is found by Newton's method on log erfc(t) = log(2q), written
# with erfcx (log erfc(t) = log erfcx(t) - t^2: no underflow down to the smallest double), from
# erfinv's guess or sqrt(-log 2q) far out; 12 steps, quadratic convergence. 0 and 1 give -inf and
# inf, outside [0, 1] NaN. Evaluated in float64, rounded once.
_NDTRI_STEPS = 12


def _ndtri64(p):
    q = aten.minimum.default(p, aten.rsub.Scalar(p, 1.0))
    q_safe = _where(aten.gt.Scalar(q, 0.0), q, _c(0.25, q))  # tails only; others replaced below
    two_q = aten.mul.Tensor(q_safe, 2.0)
    log_two_q = aten.log.default(two_q)
    guess = _erfinv64(aten.rsub.Scalar(two_q, 1.0))
    t = _where(aten.gt.Scalar(two_q, 1e-10), guess, aten.sqrt.default(aten.neg.default(log_two_q)))
    for _ in range(_NDTRI_STEPS):
        scaled = _erfc64(t, scaled=True)
        g = aten.sub.Tensor(aten.sub.Tensor(aten.log.default(scaled), aten.mul.Tensor(t, t)), log_two_q)
        t = aten.add.Tensor(t, aten.mul.Tensor(aten.mul.Tensor(g, scaled), _SQRT_PI / 2))
    tail = aten.mul.Tensor(t, math.sqrt(2.0))
    tail = _where(aten.lt.Scalar(p, 0.5), aten.neg.default(tail), tail)
    centre = aten.mul.Tensor(_erfinv64(aten.sub.Tensor(aten.mul.Tensor(p, 2.0), 1.0)), math.sqrt(2.0))
    out = _where(aten.le.Scalar(aten.abs.default(aten.sub.Tensor(p, 0.5)), 0.25), centre, tail)
    out = _where(aten.eq.Scalar(p, 0.0), _c(-math.inf, p), out)
    out = _where(aten.eq.Scalar(p, 1.0), _c(math.inf, p), out)
    bad = aten.logical_or.default(
        aten.logical_or.default(aten.lt.Scalar(p, 0.0), aten.gt.Scalar(p, 1.0)), aten.isnan.default(p)
    )
    return _where(bad, _c(math.nan, p), out)


@project_decomposition(aten.special_ndtri.default)
def special_ndtri(self):
    if not _supported(self) or self.dtype in (torch.float16, torch.bfloat16):
        return NotImplemented
    return _out(_ndtri64(_f64(self)), self)


# -- Hurwitz zeta and polygamma ------------------------------------------------------------------
# NOTE: zeta(x, q) = sum_k (q + k)^-x by the kernel's method (Euler-Maclaurin): direct terms until
# q + k > 9 (at least 9), then the integral, half the last term and 12 Bernoulli corrections
# (their coefficients (2j)!/B_2j computed here from the Bernoulli numbers), in float64 rounded
# once; the kernel's early exits only skip terms below float64's epsilon. x == 1 gives inf, x < 1
# NaN; q <= 0 gives inf at integers and NaN for a non-integer x. A negative q needs as many
# direct terms as it is below 9: a data value (such calls decompose eagerly), declined past
# _ZETA_MAX_TERMS. polygamma(n >= 2, x) = (-1)^(n+1) n! zeta(n + 1, x), as the kernel; n == 1 is
# the kernel's trigamma (reflection below 1/2, six recurrence steps, an asymptotic series);
# n == 0 is digamma.
def _bernoulli_coefficients(count):
    from fractions import Fraction

    b = [Fraction(1)]
    for m in range(1, 2 * count + 1):
        b.append(-sum(Fraction(math.comb(m + 1, k)) * b[k] for k in range(m)) / (m + 1))
    return [float(Fraction(math.factorial(2 * j + 2)) / b[2 * j + 2]) for j in range(count)]


_ZETA_A = _bernoulli_coefficients(12)
_ZETA_MAX_TERMS = 4096


def _zeta64(x, q):
    finite = aten.logical_not.default(aten.logical_or.default(aten.isnan.default(q), aten.isinf.default(q)))
    low = aten.amin.default(_where(finite, q, aten.zeros_like.default(q)), []) if q.numel() else None
    terms = 9
    if low is not None:
        lowest = float(aten._local_scalar_dense.default(low))
        if lowest < 0 and math.isfinite(lowest):
            terms = max(terms, 9 + math.ceil(-lowest))
    if terms > _ZETA_MAX_TERMS:
        return NotImplemented
    neg_x = aten.neg.default(x)
    s = aten.pow.Tensor_Tensor(q, neg_x)
    a = q
    b = aten.zeros_like.default(q)
    for _ in range(terms):
        a = aten.add.Tensor(a, 1.0)
        b = aten.pow.Tensor_Tensor(a, neg_x)
        s = aten.add.Tensor(s, b)
    w = a
    s = aten.add.Tensor(s, aten.div.Tensor(aten.mul.Tensor(b, w), aten.sub.Tensor(x, 1.0)))
    s = aten.sub.Tensor(s, aten.mul.Tensor(b, 0.5))
    fa = aten.ones_like.default(x)
    k = 0.0
    for coefficient in _ZETA_A:
        fa = aten.mul.Tensor(fa, aten.add.Tensor(x, k))
        b = aten.div.Tensor(b, w)
        s = aten.add.Tensor(s, aten.div.Tensor(aten.mul.Tensor(fa, b), coefficient))
        k += 1.0
        fa = aten.mul.Tensor(fa, aten.add.Tensor(x, k))
        b = aten.div.Tensor(b, w)
        k += 1.0
    nonpositive = aten.le.Scalar(q, 0.0)
    q_integer = aten.eq.Tensor(q, aten.floor.default(q))
    x_integer = aten.eq.Tensor(x, aten.floor.default(x))
    s = _where(aten.logical_and.default(nonpositive, aten.logical_not.default(x_integer)), _c(math.nan, s), s)
    s = _where(aten.logical_and.default(nonpositive, q_integer), _c(math.inf, s), s)
    s = _where(aten.lt.Scalar(x, 1.0), _c(math.nan, s), s)
    return _where(aten.eq.Scalar(x, 1.0), _c(math.inf, s), s)


@project_decomposition(aten.special_zeta.default)
def special_zeta(self, other):
    dtype = torch.result_type(self, other)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return NotImplemented
    shape = list(torch.broadcast_shapes(self.shape, other.shape))
    x = aten.expand.default(_f64(aten._to_copy.default(self, dtype=dtype)), shape)
    q = aten.expand.default(_f64(aten._to_copy.default(other, dtype=dtype)), shape)
    out = _zeta64(x, q)
    if out is NotImplemented:
        return out
    return aten._to_copy.default(out, dtype=dtype, memory_format=torch.contiguous_format)


def _trigamma64(x):
    reflect = aten.lt.Scalar(x, 0.5)
    s = aten.sin.default(aten.mul.Tensor(x, math.pi))
    result = _where(
        reflect, aten.neg.default(aten.div.Tensor(_c(math.pi * math.pi, x), aten.mul.Tensor(s, s))), _c(0.0, x)
    )
    x = _where(reflect, aten.rsub.Scalar(x, 1.0), x)
    for _ in range(6):
        result = aten.add.Tensor(result, aten.reciprocal.default(aten.mul.Tensor(x, x)))
        x = aten.add.Tensor(x, 1.0)
    ixx = aten.reciprocal.default(aten.mul.Tensor(x, x))
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, 1.0 / 42), 1.0 / 30)
    series = aten.rsub.Scalar(aten.mul.Tensor(ixx, series), 1.0 / 6)
    series = aten.add.Tensor(
        aten.add.Tensor(aten.reciprocal.default(aten.mul.Tensor(x, 2.0)), 1.0), aten.mul.Tensor(ixx, series)
    )
    result = aten.add.Tensor(result, aten.div.Tensor(series, x))
    return _where(reflect, aten.neg.default(result), result)


@project_decomposition(aten.polygamma.default)
def polygamma(n, self):
    if not _supported(self) or n < 0:
        return NotImplemented
    if n == 0:
        return _out(_digamma64(_f64(self)), self)
    x = _f64(self)
    if n == 1:
        return _out(_trigamma64(x), self)
    z = _zeta64(aten.full_like.default(x, float(n + 1)), x)
    if z is NotImplemented:
        return z
    return _out(aten.mul.Tensor(z, (1.0 if n % 2 else -1.0) * math.factorial(n)), self)


@project_decomposition(aten.polygamma_.default)
def polygamma_(self, n):
    if not self.dtype.is_floating_point:
        return NotImplemented
    out = polygamma(n, self)
    if out is NotImplemented:
        return out
    return aten.copy_.default(self, out)
