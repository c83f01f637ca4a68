"""The orthogonal polynomials of ``torch.special``: their kernels' branches and recurrences in core ops.

NOTE: PyTorch has no decomposition for these. Each kernel picks, per element, a special
value (n < 0, |x| == 1, the limit past which Hermite gives NaN, ...), a trigonometric
closed form (Chebyshev, for |x| < 1 past a degree threshold), or its three-term recurrence
run n - 1 times. Here the branches are masks applied in the kernel's order, and the
recurrence runs with the kernel's operation order and roundings (see _evaluate), for as many
steps as the largest degree that needs it, each element updated only while its own degree
is not reached. The step count is a data value: these calls decompose eagerly (the bypass
path); a recurrence longer than _MAX_STEPS is declined. The trigonometric forms
are evaluated in float64 and rounded once (see _closed_form): an approximation under the
accuracy rule. Where the kernel returns an uninitialized value (a NaN x with n >= 2 in the
U/V/W, Laguerre and Legendre loops) the decomposition returns NaN.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_MAX_STEPS = 4096
_F64 = torch.float64
_HERMITE_LIMIT = {torch.float32: 128, torch.float64: 512}  # past it the kernels return NaN


def _c(value, like):
    return aten.full_like.default(like, value)


def _where(cond, a, b):
    return aten.where.self(cond, a, b)


def _even(n):
    return aten.eq.Scalar(aten.remainder.Scalar(n, 2), 0)


def _signed_by_parity(n, value):
    """``value`` for even n, ``-value`` for odd n."""
    return _where(_even(n), value, aten.neg.default(value))


# -- Chebyshev T, U, V, W (shifted: the same at y = 2x - 1, other degree thresholds) --------------
# each: (value at |y| == 1, closed form for |y| < 1 past the threshold, value at n == 1)


def _edge_t(y, n, nf):
    return _where(aten.logical_or.default(aten.gt.Scalar(y, 0), _even(n)), _c(1.0, y), _c(-1.0, y))


def _edge_u(y, n, nf):
    m = aten.add.Tensor(nf, 1.0)
    return _where(aten.logical_or.default(aten.gt.Scalar(y, 0), _even(n)), m, aten.neg.default(m))


def _edge_v(y, n, nf):
    odd_sum = aten.add.Tensor(aten.add.Tensor(nf, nf), 1.0)
    return _where(aten.gt.Scalar(y, 0), _c(1.0, y), _signed_by_parity(n, odd_sum))


def _edge_w(y, n, nf):
    odd_sum = aten.add.Tensor(aten.add.Tensor(nf, nf), 1.0)
    return _where(aten.gt.Scalar(y, 0), odd_sum, _signed_by_parity(n, _c(1.0, y)))


def _trig_t(y, n, nf):
    return aten.cos.default(aten.mul.Tensor(nf, aten.acos.default(y)))


def _trig_u(y, n, nf):
    a = aten.acos.default(y)
    s = aten.sin.default(a)
    m = aten.add.Tensor(nf, 1.0)
    ratio = aten.div.Tensor(aten.sin.default(aten.mul.Tensor(m, a)), s)
    fallback = aten.div.Tensor(aten.mul.Tensor(m, aten.cos.default(aten.mul.Tensor(m, a))), y)
    return _where(aten.ne.Scalar(s, 0.0), ratio, fallback)


def _trig_v(y, n, nf):
    a = aten.acos.default(y)
    half = aten.div.Tensor(a, 2.0)
    ratio = aten.div.Tensor(aten.cos.default(aten.mul.Tensor(aten.add.Tensor(nf, 0.5), a)), aten.cos.default(half))
    odd_sum = aten.add.Tensor(aten.add.Tensor(nf, nf), 1.0)
    return _where(aten.ne.Scalar(aten.sin.default(half), 1.0), ratio, _signed_by_parity(n, odd_sum))


def _trig_w(y, n, nf):
    a = aten.acos.default(y)
    half = aten.div.Tensor(a, 2.0)
    ratio = aten.div.Tensor(aten.sin.default(aten.mul.Tensor(aten.add.Tensor(nf, 0.5), a)), aten.sin.default(half))
    return _where(aten.ne.Scalar(aten.cos.default(half), 1.0), ratio, _edge_w(y, n, nf))


_CHEBYSHEV = {  # kind: (edge, trig, first, threshold, shifted threshold)
    "t": (_edge_t, _trig_t, lambda y: y, 6, 6),
    "u": (_edge_u, _trig_u, lambda y: aten.add.Tensor(y, y), 8, 6),
    "v": (_edge_v, _trig_v, lambda y: aten.sub.Tensor(aten.add.Tensor(y, y), 1.0), 8, 6),
    "w": (_edge_w, _trig_w, lambda y: aten.add.Tensor(aten.add.Tensor(y, y), 1.0), 8, 4),
}


def _closed_form(trig, x, shifted, n, nf):
    """The trigonometric form in float64 (y = 2x - 1 too), rounded once: n * acos(y) amplifies
    a float32 rounding n-fold, so the native float32 kernel is off by many ulp at large n; the
    float64 evaluation is within an ulp of the float64 reference the accuracy rule measures by."""
    y64, nf64 = (aten._to_copy.default(t, dtype=_F64) for t in (x, nf))
    if shifted:
        y64 = aten.sub.Tensor(aten.add.Tensor(y64, y64), 1.0)
    return aten._to_copy.default(trig(y64, n, nf64), dtype=x.dtype)


def _chebyshev_step(y):
    two_y = aten._to_copy.default(aten.add.Tensor(y, y), dtype=_F64)
    return lambda k, p, q, rnd: aten.sub.Tensor(aten.mul.Tensor(two_y, q), p)


# -- the driver -----------------------------------------------------------------------------------


def _operands(x, n):
    """x and n broadcast in the result dtype, n's integer degree as the kernel casts it (and as
    a float), and the dtype."""
    if not isinstance(x, torch.Tensor) and not isinstance(n, torch.Tensor):
        return None
    dtype = torch.result_type(x, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return None
    like = x if isinstance(x, torch.Tensor) else n
    x, n = (
        t if isinstance(t, torch.Tensor) else aten.scalar_tensor.default(t, dtype=dtype, device=like.device)
        for t in (x, n)
    )
    shape = list(torch.broadcast_shapes(x.shape, n.shape))
    xt = aten.expand.default(aten._to_copy.default(x, dtype=dtype), shape)
    nt = aten.expand.default(aten._to_copy.default(n, dtype=dtype), shape)
    finite = aten.logical_not.default(aten.logical_or.default(aten.isnan.default(nt), aten.isinf.default(nt)))
    ni = _where(finite, aten._to_copy.default(nt, dtype=torch.int64), aten.full_like.default(nt, -1, dtype=torch.int64))
    return xt, ni, aten._to_copy.default(ni, dtype=dtype), dtype


def _evaluate(x, n, branches, first, step, dtype):
    """``branches``: (mask, value) pairs, the kernel's first test first; the elements no branch
    takes run the recurrence from p = 1, q = ``first`` (the degree-1 value): step k (1-based)
    gives degree k + 1. ``step(k, p, q, rnd)`` works in float64 and rounds with ``rnd`` where
    the kernel rounds: its a * q - b * p compiles to fma(a, q, -(b * p)) (b * p rounded, the
    rest fused), which a float64 evaluation of float32 operands rounded once reproduces (found
    by experiment against the kernel)."""
    taken = aten.zeros_like.default(n, dtype=torch.bool)
    for mask, _ in branches:
        taken = aten.logical_or.default(taken, mask)
    need = _where(taken, aten.zeros_like.default(n), n)
    steps = int(aten._local_scalar_dense.default(aten.amax.default(need, []))) - 1 if n.numel() else 0
    if steps > _MAX_STEPS:
        return NotImplemented

    def rnd(t):
        return t if dtype == _F64 else aten._to_copy.default(aten._to_copy.default(t, dtype=dtype), dtype=_F64)

    p, q = aten.ones_like.default(x, dtype=_F64), aten._to_copy.default(first, dtype=_F64)
    for k in range(1, steps + 1):
        r = rnd(step(k, p, q, rnd))
        going = aten.gt.Scalar(n, k)
        p, q = _where(going, q, p), _where(going, r, q)
    out = aten._to_copy.default(q, dtype=dtype)
    for mask, value in reversed(branches):
        out = _where(mask, value, out)
    return aten.clone.default(out, memory_format=torch.contiguous_format)


def _register(name, fill):
    """The decomposition for the op's Tensor overload and its x_scalar / n_scalar ones (out= forms go
    through the generic out= rule)."""
    packet = getattr(aten, name)
    project_decomposition([packet.default, packet.x_scalar, packet.n_scalar])(fill)


def _chebyshev(kind, shifted):
    edge, trig, first, threshold, shifted_threshold = _CHEBYSHEV[kind]
    threshold = shifted_threshold if shifted else threshold

    def fill(x, n):
        ops = _operands(x, n)
        if ops is None:
            return NotImplemented
        x, n, nf, dtype = ops
        y = aten.sub.Tensor(aten.add.Tensor(x, x), 1.0) if shifted else x
        ay = aten.abs.default(y)
        q1 = first(y)
        branches = [
            (aten.lt.Scalar(n, 0), aten.zeros_like.default(x)),
            (aten.eq.Scalar(ay, 1.0), edge(y, n, nf)),
            (
                aten.logical_and.default(aten.gt.Scalar(n, threshold), aten.lt.Scalar(ay, 1.0)),
                _closed_form(trig, x, shifted, n, nf),
            ),
            (aten.eq.Scalar(n, 0), aten.ones_like.default(x)),
            (aten.eq.Scalar(n, 1), q1),
        ]
        return _evaluate(x, n, branches, q1, _chebyshev_step(y), dtype)

    return fill


for _kind in "tuvw":
    _register(f"special_chebyshev_polynomial_{_kind}", _chebyshev(_kind, False))
    _register(f"special_shifted_chebyshev_polynomial_{_kind}", _chebyshev(_kind, True))


def _hermite(physicists):
    def fill(x, n):
        ops = _operands(x, n)
        if ops is None:
            return NotImplemented
        x, n, nf, dtype = ops
        q1 = aten.add.Tensor(x, x) if physicists else x
        branches = [
            (aten.lt.Scalar(n, 0), aten.zeros_like.default(x)),
            (aten.eq.Scalar(n, 0), aten.ones_like.default(x)),
            (aten.eq.Scalar(n, 1), q1),
            (aten.gt.Scalar(n, _HERMITE_LIMIT[dtype]), _c(math.nan, x)),
        ]
        a = aten._to_copy.default(q1 if physicists else x, dtype=_F64)
        scale = 2 if physicists else 1  # H: r = 2x q - 2k p; He: r = x q - k p

        def step(k, p, q, rnd):
            return aten.sub.Tensor(aten.mul.Tensor(a, q), rnd(aten.mul.Tensor(p, float(scale * k))))

        return _evaluate(x, n, branches, q1, step, dtype)

    return fill


_register("special_hermite_polynomial_h", _hermite(True))
_register("special_hermite_polynomial_he", _hermite(False))


def laguerre_polynomial_l(x, n):
    ops = _operands(x, n)
    if ops is None:
        return NotImplemented
    x, n, nf, dtype = ops
    one_minus_x = aten.rsub.Scalar(x, 1.0)
    branches = [
        (aten.lt.Scalar(n, 0), aten.zeros_like.default(x)),
        (aten.eq.Scalar(aten.abs.default(x), 0.0), aten.ones_like.default(x)),
        (aten.eq.Scalar(n, 0), aten.ones_like.default(x)),
        (aten.eq.Scalar(n, 1), one_minus_x),
    ]

    def step(k, p, q, rnd):  # ((2k + (1 - x)) q - k p) / (k + 1)
        a = aten.mul.Tensor(rnd(aten.add.Tensor(aten._to_copy.default(one_minus_x, dtype=_F64), float(2 * k))), q)
        return aten.div.Tensor(rnd(aten.sub.Tensor(a, rnd(aten.mul.Tensor(p, float(k))))), float(k + 1))

    return _evaluate(x, n, branches, one_minus_x, step, dtype)


def legendre_polynomial_p(x, n):
    ops = _operands(x, n)
    if ops is None:
        return NotImplemented
    x, n, nf, dtype = ops
    branches = [
        (aten.lt.Scalar(n, 0), aten.zeros_like.default(x)),
        (aten.eq.Scalar(aten.abs.default(x), 1.0), _edge_t(x, n, nf)),
        (aten.eq.Scalar(n, 0), aten.ones_like.default(x)),
        (aten.eq.Scalar(n, 1), x),
    ]

    def step(k, p, q, rnd):  # ((2k + 1) x q - k p) / (k + 1)
        a = aten.mul.Tensor(rnd(aten.mul.Tensor(aten._to_copy.default(x, dtype=_F64), float(2 * k + 1))), q)
        return aten.div.Tensor(rnd(aten.sub.Tensor(a, rnd(aten.mul.Tensor(p, float(k))))), float(k + 1))

    return _evaluate(x, n, branches, x, step, dtype)


_register("special_laguerre_polynomial_l", laguerre_polynomial_l)
_register("special_legendre_polynomial_p", legendre_polynomial_p)
