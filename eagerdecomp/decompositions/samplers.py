"""Rejection samplers (poisson, binomial, _standard_gamma, _sample_dirichlet) from core ``rand``/``randn``,
and the gamma draw's reparameterized gradient (``_standard_gamma_grad``).

Each follows its CPU kernel's algorithm and edge cases (``aten/src/ATen/native/
Distributions.{h,cpp}``): Hörmann's transformed rejection for large means, Knuth's
product of uniforms or geometric inversion for small ones, Marsaglia and Tsang for the
gamma. The kernel runs one element at a time until it accepts; here every element still
waiting draws in the same round, and rounds repeat until all have accepted. The draws come
from ``torch.manual_seed``'s stream in another order than the kernel's, so the numbers
differ from eager's while the distribution is the same (checked by distribution tests in
``tests/decompositions/test_samplers.py``), and the same seed gives the same numbers. The loop reads a data
value each round, so these ops decompose eagerly on every call (not cached); the gradient is
pointwise and is traced once.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.order import _item
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
f64 = torch.float64

# NOTE: a round accepts most waiting elements (at least about 0.24 of them for the worst
# binomial case, far more for the others), so this many rounds leave one waiting only with
# probability below 1e-100: a stuck loop is a bug, reported instead of spinning forever.
MAX_ROUNDS = 2000


def _floats(self):
    """The CPU kernels dispatch on float and double only."""
    return self.dtype in (torch.float32, torch.float64)


def _uniform(like):
    return aten.rand.default(list(like.shape), dtype=f64, device=like.device)


def _full(like, value, dtype=f64):
    return aten.full.default(list(like.shape), value, dtype=dtype, device=like.device)


def _rounds(name, waiting, step):
    """Call ``step(waiting)`` (it returns the elements that accepted) until none wait."""
    for _ in range(MAX_ROUNDS):
        if not _item(aten.any.default(waiting)):
            return
        waiting = aten.logical_and.default(waiting, aten.logical_not.default(step(waiting)))
    raise RuntimeError(f"{name}: rejection sampling did not finish in {MAX_ROUNDS} rounds (eagerdecomp bug)")


# NOTE: the kernel's (int64_t)floor(...): the same cast, so a huge or infinite rate gives
# what the kernel's overflowing conversion gives on this device, not a different number.
def _as_int64(x):
    return aten._to_copy.default(aten._to_copy.default(aten.floor.default(x), dtype=torch.int64), dtype=f64)


def _ptrs_poisson(lam, waiting):
    """Hörmann's PTRS for the elements with rate >= 10."""
    out = _full(lam, 0.0)
    slam, loglam = aten.sqrt.default(lam), aten.log.default(lam)
    b = aten.add.Tensor(aten.mul.Tensor(slam, 2.53), 0.931)
    a = aten.add.Tensor(aten.mul.Tensor(b, 0.02483), -0.059)
    invalpha = aten.add.Tensor(aten.div.Tensor(aten.full_like.default(b, 1.1328), aten.sub.Tensor(b, 3.4)), 1.1239)
    vr = aten.rsub.Scalar(aten.div.Tensor(aten.full_like.default(b, 3.6224), aten.sub.Tensor(b, 2)), 0.9277)

    def step(wait):
        nonlocal out
        u = aten.sub.Tensor(_uniform(lam), 0.5)
        v = _uniform(lam)
        us = aten.rsub.Scalar(aten.abs.default(u), 0.5)
        k = _as_int64(
            aten.add.Tensor(
                aten.add.Tensor(
                    aten.mul.Tensor(aten.add.Tensor(aten.div.Tensor(aten.mul.Tensor(a, 2), us), b), u), lam
                ),
                0.43,
            )
        )
        quick = aten.logical_and.default(aten.ge.Scalar(us, 0.07), aten.le.Tensor(v, vr))
        skip = aten.logical_or.default(
            aten.lt.Scalar(k, 0), aten.logical_and.default(aten.lt.Scalar(us, 0.013), aten.gt.Tensor(v, us))
        )
        lhs = aten.sub.Tensor(
            aten.add.Tensor(aten.log.default(v), aten.log.default(invalpha)),
            aten.log.default(aten.add.Tensor(aten.div.Tensor(a, aten.mul.Tensor(us, us)), b)),
        )
        rhs = aten.sub.Tensor(
            aten.add.Tensor(aten.neg.default(lam), aten.mul.Tensor(k, loglam)),
            aten.lgamma.default(aten.add.Tensor(k, 1)),
        )
        take = aten.logical_and.default(
            wait,
            aten.logical_or.default(
                quick, aten.logical_and.default(aten.logical_not.default(skip), aten.le.Tensor(lhs, rhs))
            ),
        )
        out = aten.where.self(take, k, out)
        return take

    _rounds("poisson", waiting, step)
    return out


def _knuth_poisson(lam, waiting):
    """Knuth's product of uniforms for the elements with 0 < rate < 10."""
    count, prod = _full(lam, 0.0), _full(lam, 1.0)
    enlam = aten.exp.default(aten.neg.default(lam))

    def step(wait):
        nonlocal count, prod
        prod = aten.where.self(wait, aten.mul.Tensor(prod, _uniform(lam)), prod)
        more = aten.logical_and.default(wait, aten.gt.Tensor(prod, enlam))
        count = aten.add.Tensor(count, aten._to_copy.default(more, dtype=f64))
        return aten.logical_and.default(wait, aten.logical_not.default(more))

    _rounds("poisson", waiting, step)
    return count


@project_decomposition(aten.poisson.default)
def poisson(self, generator=None):
    if generator is not None or not _floats(self):
        return NotImplemented
    lam = aten._to_copy.default(self, dtype=f64)
    if _item(aten.any.default(aten.logical_not.default(aten.ge.Scalar(lam, 0)))):  # NaN fails it too
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    large = aten.ge.Scalar(lam, 10)
    small = aten.logical_and.default(aten.gt.Scalar(lam, 0), aten.logical_not.default(large))
    # NOTE: each regime draws in its own rounds, with a safe rate elsewhere so no NaN appears
    out = aten.where.self(
        large,
        _ptrs_poisson(aten.where.self(large, lam, _full(lam, 10.0)), large),
        _knuth_poisson(aten.where.self(small, lam, _full(lam, 1.0)), small),
    )
    return aten._to_copy.default(out, dtype=self.dtype)


# -- binomial ----------------------------------------------------------------------------

_TAIL = (
    0.0810614667953272,
    0.0413406959554092,
    0.0276779256849983,
    0.02079067210376509,
    0.0166446911898211,
    0.0138761288230707,
    0.0118967099458917,
    0.0104112652619720,
    0.00925546218271273,
    0.00833056343336287,
)


def _stirling_tail(k):
    """log k! minus its Stirling approximation: the kernel's table to 9, its series beyond."""
    table = aten._to_copy.default(torch.tensor(_TAIL, dtype=f64), device=k.device)
    index = aten._to_copy.default(aten.clamp.default(k, 0, 9), dtype=torch.int64)
    kp1 = aten.add.Tensor(k, 1)
    kp1sq = aten.mul.Tensor(kp1, kp1)
    series = aten.div.Tensor(
        aten.rsub.Scalar(
            aten.div.Tensor(aten.rsub.Scalar(aten.div.Tensor(aten.reciprocal.default(kp1sq), 1260), 1 / 360), kp1sq),
            1 / 12,
        ),
        kp1,
    )
    return aten.where.self(aten.le.Scalar(k, 9), aten.index.Tensor(table, [index]), series)


def _btrs(count, prob, waiting, scalar):
    """Hörmann's BTRS as the kernel writes it (k in the input's precision, the rest in double)."""
    out = _full(count, 0.0)
    stddev = aten.sqrt.default(aten.mul.Tensor(aten.mul.Tensor(count, prob), aten.rsub.Scalar(prob, 1)))
    b = aten.add.Tensor(aten.mul.Tensor(stddev, 2.53), 1.15)
    a = aten.add.Tensor(aten.add.Tensor(aten.mul.Tensor(b, 0.0248), aten.mul.Tensor(prob, 0.01)), -0.0873)
    c = aten.add.Tensor(aten.mul.Tensor(count, prob), 0.5)
    v_r = aten.rsub.Scalar(aten.div.Tensor(aten.full_like.default(b, 4.2), b), 0.92)
    r = aten.div.Tensor(prob, aten.rsub.Scalar(prob, 1))
    alpha = aten.mul.Tensor(aten.add.Tensor(aten.div.Tensor(aten.full_like.default(b, 5.1), b), 2.83), stddev)
    m = aten.floor.default(aten.mul.Tensor(aten.add.Tensor(count, 1), prob))

    def log(x):
        return aten.log.default(x)

    def step(wait):
        nonlocal out
        u = aten.sub.Tensor(_uniform(count), 0.5)
        v = _uniform(count)
        us = aten.rsub.Scalar(aten.abs.default(u), 0.5)
        k = aten.floor.default(
            aten.add.Tensor(aten.mul.Tensor(aten.add.Tensor(aten.div.Tensor(aten.mul.Tensor(a, 2), us), b), u), c)
        )
        k = aten._to_copy.default(aten._to_copy.default(k, dtype=scalar), dtype=f64)  # static_cast<scalar_t>
        sensible = aten.logical_not.default(aten.logical_or.default(aten.lt.Scalar(k, 0), aten.gt.Tensor(k, count)))
        quick = aten.logical_and.default(aten.ge.Scalar(us, 0.07), aten.le.Tensor(v, v_r))
        lv = log(
            aten.div.Tensor(aten.mul.Tensor(v, alpha), aten.add.Tensor(aten.div.Tensor(a, aten.mul.Tensor(us, us)), b))
        )
        n_m1 = aten.add.Tensor(aten.sub.Tensor(count, m), 1)
        n_k1 = aten.add.Tensor(aten.sub.Tensor(count, k), 1)
        bound = aten.mul.Tensor(
            aten.add.Tensor(m, 0.5), log(aten.div.Tensor(aten.add.Tensor(m, 1), aten.mul.Tensor(r, n_m1)))
        )
        bound = aten.add.Tensor(bound, aten.mul.Tensor(aten.add.Tensor(count, 1), log(aten.div.Tensor(n_m1, n_k1))))
        bound = aten.add.Tensor(
            bound,
            aten.mul.Tensor(
                aten.add.Tensor(k, 0.5), log(aten.div.Tensor(aten.mul.Tensor(r, n_k1), aten.add.Tensor(k, 1)))
            ),
        )
        bound = aten.add.Tensor(aten.add.Tensor(bound, _stirling_tail(m)), _stirling_tail(aten.sub.Tensor(count, m)))
        bound = aten.sub.Tensor(aten.sub.Tensor(bound, _stirling_tail(k)), _stirling_tail(aten.sub.Tensor(count, k)))
        take = aten.logical_and.default(
            aten.logical_and.default(wait, sensible), aten.logical_or.default(quick, aten.le.Tensor(lv, bound))
        )
        out = aten.where.self(take, k, out)
        return take

    _rounds("binomial", waiting, step)
    return out


def _inversion(count, prob, waiting):
    """The kernel's geometric inversion: count successes by summing geometric gaps."""
    found, gaps = _full(count, 0.0), _full(count, 0.0)
    logq = aten.log1p.default(aten.neg.default(prob))

    def step(wait):
        nonlocal found, gaps
        gap = aten.ceil.default(aten.div.Tensor(aten.log.default(_uniform(count)), logq))
        gaps = aten.where.self(wait, aten.add.Tensor(gaps, gap), gaps)
        done = aten.logical_and.default(wait, aten.gt.Tensor(gaps, count))
        found = aten.add.Tensor(
            found, aten._to_copy.default(aten.logical_and.default(wait, aten.logical_not.default(done)), dtype=f64)
        )
        return done

    _rounds("binomial", waiting, step)
    return found


# NOTE: binomial's cases as the kernel orders them: no trials or p <= 0 gives 0, p >= 1 the
# count, p <= 0.5 samples successes, p > 0.5 samples failures (count minus them); the switch
# from inversion to BTRS is count * min(p, 1 - p) >= 10 in the input's precision. A NaN p
# gives NaN. A NaN count never returns from the kernel's loop; here it is an error.
@project_decomposition(aten.binomial.default)
def binomial(count, prob, generator=None):
    if generator is not None or not _floats(count) or prob.dtype != count.dtype:
        return NotImplemented
    scalar = count.dtype
    prob = aten.expand.default(prob, list(count.shape))
    n = aten._to_copy.default(count, dtype=f64)
    p = aten._to_copy.default(prob, dtype=f64)
    nothing = aten.logical_or.default(aten.le.Scalar(n, 0), aten.le.Scalar(p, 0))
    all_ = aten.logical_and.default(aten.logical_not.default(nothing), aten.ge.Scalar(p, 1))
    live = aten.logical_and.default(
        aten.logical_not.default(nothing), aten.logical_and.default(aten.gt.Scalar(p, 0), aten.lt.Scalar(p, 1))
    )
    if _item(aten.any.default(aten.logical_and.default(live, aten.isnan.default(n)))):
        raise RuntimeError("binomial: a NaN count (the CPU kernel never returns for it)")
    flip = aten.gt.Scalar(p, 0.5)
    q = aten.where.self(flip, aten.rsub.Scalar(p, 1), p)
    # the kernel's count * q >= 10 is computed in the input's precision
    mean = aten._to_copy.default(aten.mul.Tensor(count, aten._to_copy.default(q, dtype=scalar)), dtype=f64)
    big = aten.logical_and.default(live, aten.ge.Scalar(mean, 10))
    few = aten.logical_and.default(live, aten.logical_not.default(big))
    safe_q = aten.where.self(live, q, _full(q, 0.25))
    safe_n = aten.where.self(live, n, _full(n, 40.0))
    drawn = aten.where.self(big, _btrs(safe_n, safe_q, big, scalar), _inversion(safe_n, safe_q, few))
    drawn = aten.where.self(flip, aten.sub.Tensor(n, drawn), drawn)
    out = aten.where.self(
        nothing, _full(n, 0.0), aten.where.self(all_, n, aten.where.self(live, drawn, _full(n, math.nan)))
    )
    return aten._to_copy.default(out, dtype=scalar)


# -- gamma -------------------------------------------------------------------------------


# NOTE: Marsaglia and Tsang, with the kernel's boost for alpha < 1 (a Gamma(alpha + 1) draw
# times U ** (1 / alpha)). The kernel redraws x alone while 1 + c x <= 0; rejecting the whole
# round instead draws from the same distribution. Alpha 0 (and NaN, which the kernel turns
# into its floor below) leaves 0.
def _gamma(alpha):
    """Gamma(alpha) draws in double for a double ``alpha``, before the callers' floors."""
    boost = aten.lt.Scalar(alpha, 1)
    scale = aten.where.self(
        boost,
        aten.pow.Tensor_Tensor(aten.rsub.Scalar(_uniform(alpha), 1), aten.reciprocal.default(alpha)),
        _full(alpha, 1.0),
    )
    alpha = aten.where.self(boost, aten.add.Tensor(alpha, 1), alpha)
    waiting = aten.logical_and.default(aten.logical_not.default(aten.isnan.default(alpha)), aten.ne.Scalar(scale, 0))
    safe = aten.where.self(waiting, alpha, _full(alpha, 2.0))
    d = aten.sub.Tensor(safe, 1 / 3)
    c = aten.reciprocal.default(aten.sqrt.default(aten.mul.Tensor(d, 9)))
    out = _full(alpha, 0.0)

    def step(wait):
        nonlocal out
        x = aten.randn.default(list(alpha.shape), dtype=f64, device=alpha.device)
        y = aten.add.Tensor(aten.mul.Tensor(c, x), 1)
        v = aten.mul.Tensor(aten.mul.Tensor(y, y), y)
        u = aten.rsub.Scalar(_uniform(alpha), 1)
        xx = aten.mul.Tensor(x, x)
        squeeze = aten.lt.Tensor(u, aten.rsub.Scalar(aten.mul.Tensor(aten.mul.Tensor(xx, xx), 0.0331), 1))
        full = aten.lt.Tensor(
            aten.log.default(u),
            aten.add.Tensor(
                aten.mul.Tensor(xx, 0.5),
                aten.mul.Tensor(d, aten.add.Tensor(aten.rsub.Scalar(v, 1), aten.log.default(v))),
            ),
        )
        take = aten.logical_and.default(
            aten.logical_and.default(wait, aten.gt.Scalar(y, 0)), aten.logical_or.default(squeeze, full)
        )
        out = aten.where.self(take, aten.mul.Tensor(aten.mul.Tensor(scale, d), v), out)
        return take

    _rounds("gamma", waiting, step)
    return out


def _at_least(x, floor):
    """std::max(floor, x): NaN gives the floor."""
    floor = aten.full_like.default(x, floor)
    return aten.where.self(aten.lt.Tensor(floor, x), x, floor)


# NOTE: the kernel's final max(tiny, sample): alpha 0 and NaN give the dtype's smallest
# normal number, as eager does.
@project_decomposition(aten._standard_gamma.default)
def standard_gamma(self, generator=None):
    if generator is not None or not _floats(self):
        return NotImplemented
    sample = aten._to_copy.default(_gamma(aten._to_copy.default(self, dtype=f64)), dtype=self.dtype)
    return _at_least(sample, torch.finfo(self.dtype).tiny)


# NOTE: Dirichlet as the kernel draws it: gamma draws in double (floored at double's
# smallest normal), normalized along the last dim, cast, and kept inside
# [smallest normal, the float just below 1] of the result dtype.
@project_decomposition(aten._sample_dirichlet.default)
def sample_dirichlet(self, generator=None):
    if generator is not None or not _floats(self):
        return NotImplemented
    gamma = _at_least(_gamma(aten._to_copy.default(self, dtype=f64)), torch.finfo(f64).tiny)
    share = aten._to_copy.default(aten.div.Tensor(gamma, aten.sum.dim_IntList(gamma, [-1], True)), dtype=self.dtype)
    share = _at_least(share, torch.finfo(self.dtype).tiny)
    below_one = aten.full_like.default(share, math.nextafter(1.0, 0.0) if self.dtype == f64 else 1 - 2.0**-24)
    return aten.where.self(aten.lt.Tensor(share, below_one), share, below_one)


def _poly(v, coefs):
    """coefs[0] + v * (coefs[1] + v * (coefs[2] + v * coefs[3])) (Horner, as the kernel)."""
    out = coefs[3]
    for c in reversed(coefs[:3]):
        out = aten.add.Tensor(aten.mul.Tensor(out, v), c)
    return out


_GRAD_UV = (
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (
        0.040121004,
        -0.0065914022,
        -0.0026286047,
        -0.0013441777,
        0.017050642,
        -0.0021309326,
        0.00085092367,
        -1.5247877e-07,
    ),
)


# NOTE: the reparameterized gradient of a Gamma draw (Gamma.rsample's backward) by the
# kernel's three approximations, in double: a Taylor series of the CDF for x < 0.8 (NaN
# becomes 0 there, as in the kernel), Rice's saddle-point expansion for alpha > 8, and a
# bivariate rational function of log(x / alpha) and log(alpha) otherwise. Pointwise:
# traced once and replayed. It agrees with the kernel to rounding (digamma is computed by
# eagerdecomp's digamma, not the kernel's private one).
@project_decomposition(aten._standard_gamma_grad.default)
def standard_gamma_grad(self, output):
    if not _floats(self):
        return NotImplemented
    alpha, x = aten._to_copy.default(self, dtype=f64), aten._to_copy.default(output, dtype=f64)
    # Taylor series for small x
    numer, denom = aten.full_like.default(x, 1.0), alpha
    series1 = aten.reciprocal.default(denom)
    series2 = aten.reciprocal.default(aten.mul.Tensor(denom, denom))
    for i in range(1, 6):
        numer = aten.mul.Tensor(numer, aten.div.Tensor(aten.neg.default(x), float(i)))
        denom = aten.add.Tensor(denom, 1)
        series1 = aten.add.Tensor(series1, aten.div.Tensor(numer, denom))
        series2 = aten.add.Tensor(series2, aten.div.Tensor(numer, aten.mul.Tensor(denom, denom)))
    pow_x_alpha = aten.pow.Tensor_Tensor(x, alpha)
    pdf = aten.mul.Tensor(aten.pow.Tensor_Tensor(x, aten.sub.Tensor(alpha, 1)), aten.exp.default(aten.neg.default(x)))
    cdf = aten.mul.Tensor(pow_x_alpha, series1)
    cdf_alpha = aten.sub.Tensor(
        aten.mul.Tensor(aten.sub.Tensor(aten.log.default(x), aten.digamma.default(alpha)), cdf),
        aten.mul.Tensor(pow_x_alpha, series2),
    )
    taylor = aten.div.Tensor(aten.neg.default(cdf_alpha), pdf)
    taylor = aten.where.self(aten.isnan.default(taylor), aten.zeros_like.default(taylor), taylor)
    # Rice saddle point for large alpha: near the mode, then away from it
    aa = aten.mul.Tensor(alpha, alpha)
    near_num1 = aten.add.Tensor(
        aten.mul.Tensor(aten.mul.Tensor(alpha, 24), aten.add.Tensor(aten.mul.Tensor(alpha, 12), 1)), 1
    )
    near_num2 = aten.add.Tensor(
        aten.sub.Tensor(
            aten.add.Tensor(
                aten.mul.Tensor(aa, 1440),
                aten.mul.Tensor(aten.mul.Tensor(x, 6), aten.rsub.Scalar(aten.mul.Tensor(x, 120), 53)),
            ),
            aten.div.Tensor(aten.mul.Tensor(aten.mul.Tensor(x, x), 65), alpha),
        ),
        aten.mul.Tensor(alpha, aten.add.Tensor(aten.mul.Tensor(x, 3600), 107)),
    )
    near = aten.div.Tensor(aten.mul.Tensor(near_num1, near_num2), aten.mul.Tensor(aten.mul.Tensor(aa, aa), 1244160))
    sq = aten.sqrt.default(aten.mul.Tensor(alpha, 8))
    term2 = aten.div.Tensor(sq, aten.sub.Tensor(alpha, x))
    log_ratio = aten.log.default(aten.div.Tensor(x, alpha))
    term3 = aten.pow.Tensor_Scalar(aten.sub.Tensor(aten.sub.Tensor(x, alpha), aten.mul.Tensor(alpha, log_ratio)), -1.5)
    term23 = aten.where.self(aten.lt.Tensor(x, alpha), aten.sub.Tensor(term2, term3), aten.add.Tensor(term2, term3))
    diff = aten.sub.Tensor(alpha, x)
    term1 = aten.sub.Tensor(
        aten.mul.Tensor(log_ratio, term23),
        aten.div.Tensor(
            aten.mul.Tensor(
                aten.sqrt.default(aten.div.Tensor(aten.full_like.default(alpha, 2.0), alpha)), aten.add.Tensor(alpha, x)
            ),
            aten.mul.Tensor(diff, diff),
        ),
    )
    inv12 = aten.reciprocal.default(aten.mul.Tensor(alpha, 12))
    stirling = aten.add.Tensor(
        aten.mul.Tensor(inv12, aten.add.Tensor(aten.reciprocal.default(aten.mul.Tensor(alpha, 24)), 1)), 1
    )
    far = aten.div.Tensor(aten.neg.default(aten.mul.Tensor(stirling, aten.mul.Tensor(x, term1))), sq)
    in_band = aten.logical_and.default(
        aten.le.Tensor(aten.mul.Tensor(alpha, 0.9), x), aten.le.Tensor(x, aten.mul.Tensor(alpha, 1.1))
    )
    rice = aten.where.self(in_band, near, far)
    # rational approximation in (u, v) = (log(x / alpha), log(alpha))
    u, v = log_ratio, aten.log.default(alpha)
    coef = [
        aten.add.Tensor(
            aten.mul.Tensor(u, aten.add.Tensor(aten.mul.Tensor(u, _GRAD_UV[2][i]), _GRAD_UV[1][i])), _GRAD_UV[0][i]
        )
        for i in range(8)
    ]
    p = _poly(v, coef[:4])
    q = _poly(v, coef[4:])
    rational = aten.exp.default(aten.div.Tensor(p, q))
    out = aten.where.self(aten.lt.Scalar(x, 0.8), taylor, aten.where.self(aten.gt.Scalar(alpha, 8), rice, rational))
    return aten._to_copy.default(out, dtype=self.dtype)
