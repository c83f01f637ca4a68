"""Every random op with a path under the mode: eager's numbers, or eager's distribution.

:data:`CASES` holds one or more calls per random op (the ops tagged
``nondeterministic_seeded`` that the mode's table, its opset or a CompositeImplicit kernel
covers; :func:`test_every_random_op_with_a_path_has_a_case` keeps the list complete, and
:data:`EXCLUDED` names the others with the reason). Each case runs natively and under the mode
from the same seed, with the independent :class:`RecordingMode` witness outside it, and:

* matches eager's output structure, dtypes, shapes and strides, and is reproducible under
  ``torch.manual_seed``;
* where its numbers are eager's (decided at run time), equals eager bitwise, NaNs included;
* where they are not, holds its support (e.g. ``uniform_(a, b)`` in ``[a, b)``, ``bernoulli`` in
  {0, 1}, ``geometric_`` integers >= 1; the native draw is held to it too, so a wrong support
  cannot hide in the spec), matches a native draw from another seed by the sign-flip test of
  :func:`tests.distributions.same_distribution` (means, second moments, the empirical CDF at 31
  quantiles or at every value of a discrete op) and, for float32/float64 where the law is known,
  the law itself by Kolmogorov-Smirnov (:func:`~tests.distributions.matches_cdf`) and a CLT check
  of its mean and variance.

False alarms: at most 1e-6 per distribution check (the sign-flip and KS bounds hold for any
distribution, with Bonferroni over the statistics) plus about 1e-7 per moment under the normal
approximation; every draw is at a fixed seed, so each test is deterministic anyway. The sample
sizes (50,000 values in 500 units) catch a parameter off by a few percent: the planted defect of
issue 50 (``normal`` with mean + 1 and standard deviation x 2, registered as the real one is)
fails them, :func:`test_a_planted_normal_defect_fails_the_distribution_checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.decompositions.table import default_table
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.ops.schema import overloads
from eagerdecomp.testing import RecordingMode
from tests.distributions import as_units, matches_cdf, moments_match, same_distribution
from tests.mutate import NORMAL_OPS, plant_normal_defect

aten = torch.ops.aten

SEED, OTHER_SEED = 1234, 4321
UNITS = 500  # independent units per draw (the sign-flip test's k)
N = 100 * UNITS
SMALL = 20 * UNITS  # the samplers' rejection loops decompose on every call: fewer values

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
REDUCED = (BF16, F16)


@dataclass(frozen=True)
class Case:
    """One call of a random op (``draw``, run natively and under the mode) and its law.

    ``view`` maps the output to the tensor whose values are tested, ``[UNITS, ...]`` with rows
    that share no draw; ``support(output) -> bool`` holds for every correct draw; ``cdf`` (of a
    float64 tensor; ``lattice``: on the integers) and ``moments`` (mean, variance) are the law of
    the viewed values, when known, for float32/float64 outputs.
    """

    draw: Callable
    ops: tuple
    support: Callable | None = None
    cdf: Callable | None = None
    lattice: bool = False
    moments: tuple | None = None
    view: Callable | None = None
    opsets: tuple = ("core_aten",)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _units(out):
    return as_units(_first(out), UNITS)


# -- laws --------------------------------------------------------------------------------------


def _uniform_cdf(a, b):
    return lambda x: ((x - a) / (b - a)).clamp(0, 1)


def _normal_cdf(mean, std):
    return lambda x: 0.5 * (1 + torch.erf((x - mean) / (std * math.sqrt(2))))


def _exponential_cdf(lambd):
    return lambda x: torch.where(x > 0, -torch.expm1(-lambd * x.clamp(min=0)), 0.0)


def _cauchy_cdf(median, sigma):
    return lambda x: 0.5 + torch.atan((x - median) / sigma) / math.pi


def _log_normal_cdf(mean, std):
    normal = _normal_cdf(mean, std)
    return lambda x: torch.where(x > 0, normal(torch.log(x.clamp(min=1e-300))), 0.0)


def _geometric_cdf(p):
    return lambda x: torch.where(x >= 1, -torch.expm1(torch.floor(x) * math.log1p(-p)), 0.0)


def _integers_cdf(low, high):
    """Uniform on the integers ``low .. high - 1``."""
    return lambda x: ((torch.floor(x) - low + 1) / (high - low)).clamp(0, 1)


def _table_cdf(probs):
    """A law on ``0 .. len(probs) - 1``."""
    cum = torch.tensor(probs, dtype=torch.float64).cumsum(0)
    cum = cum / cum[-1]

    def cdf(x):
        k = torch.floor(x)
        inside = (k >= 0) & (k < len(probs))
        return torch.where(inside, cum[k.clamp(0, len(probs) - 1).long()], (k >= len(probs)).to(torch.float64))

    return cdf


def _poisson_cdf(lam):
    return lambda x: torch.where(
        x >= 0, torch.special.gammaincc(torch.floor(x.clamp(min=0)) + 1, torch.tensor(lam, dtype=torch.float64)), 0.0
    )


def _binomial_probs(n, p):
    k = torch.arange(n + 1, dtype=torch.float64)
    log = torch.lgamma(torch.tensor(n + 1.0)) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
    return (log + k * math.log(p) + (n - k) * math.log1p(-p)).exp().tolist()


def _gamma_cdf(alpha):
    return lambda x: torch.special.gammainc(torch.tensor(alpha, dtype=torch.float64), x.clamp(min=0))


# -- supports ----------------------------------------------------------------------------------


def _all(pred):
    """A support over the viewed values (the first output unless the case views another)."""
    return lambda out: bool(pred(_first(out).detach().double()).all())


def _integral(x):
    return torch.floor(x) == x


def _in(a, b, closed=False):
    return _all(lambda x: (x >= a) & ((x <= b) if closed else (x < b)))


def _values_in(*values):
    return _all(lambda x: torch.isin(x, torch.tensor(values, dtype=torch.float64)))


def _int_range(low, high):
    return _all(lambda x: _integral(x) & (x >= low) & (x < high))


# -- the cases ---------------------------------------------------------------------------------

CASES: dict = {}


def _empty(dtype=F32, n=N):
    return torch.empty(n, dtype=dtype)


def _float_family(op, make, ops, law, support, dtypes=(F32, F64, BF16, F16), opsets=("core_aten",)):
    """``op`` at ``dtypes`` (the law is checked at the dtypes that do not round it: check_case)."""
    for dtype in dtypes:
        CASES[f"{op} {str(dtype).removeprefix('torch.')}"] = Case(
            lambda dtype=dtype: make(dtype), ops, support, opsets=opsets, **law
        )


# uniform: [a, b) in float32/float64; a reduced dtype can round up to b itself
UNIFORM = dict(cdf=_uniform_cdf(-2.0, 5.0), moments=(1.5, 49 / 12))
_float_family(
    "uniform_",
    lambda dt: _empty(dt).uniform_(-2.0, 5.0),
    ("aten.uniform_.default",),
    UNIFORM,
    _in(-2.0, 5.0, closed=True),
    opsets=("core_aten", "prims"),
)
CASES["uniform_ float32 [a, b)"] = Case(
    lambda: _empty().uniform_(-2.0, 5.0), ("aten.uniform_.default",), _in(-2.0, 5.0), **UNIFORM
)
CASES["uniform"] = Case(lambda: aten.uniform(_empty(), -2.0, 5.0), ("aten.uniform.default",), _in(-2.0, 5.0), **UNIFORM)
CASES["uniform.out"] = Case(
    lambda: aten.uniform.out(_empty(), -2.0, 5.0, out=_empty()),
    ("aten.uniform.out",),
    _in(-2.0, 5.0),
    **UNIFORM,
    opsets=("core_aten", "prims"),
)
CASES["rand"] = Case(
    lambda: torch.rand(N), ("aten.rand.default",), _in(0.0, 1.0), cdf=_uniform_cdf(0, 1), moments=(0.5, 1 / 12)
)
_float_family(
    "rand_like",
    lambda dt: torch.rand_like(_empty(dt)),
    ("aten.rand_like.default",),
    dict(cdf=_uniform_cdf(0, 1), moments=(0.5, 1 / 12)),
    _in(0.0, 1.0, closed=True),
    dtypes=(F32, F64, BF16),
)

# normal: every overload, N(1.5, 2) unless said otherwise
NORMAL = dict(cdf=_normal_cdf(1.5, 2.0), moments=(1.5, 4.0))
FINITE = _all(torch.isfinite)
_float_family(
    "normal_",
    lambda dt: _empty(dt).normal_(1.5, 2.0),
    ("aten.normal_.default",),
    NORMAL,
    FINITE,
    opsets=("core_aten", "prims"),
)
CASES["normal_ non-contiguous"] = Case(
    lambda: torch.empty(100, UNITS).t().normal_(1.5, 2.0), ("aten.normal_.default",), FINITE, **NORMAL
)
CASES["normal(Tensor, float)"] = Case(
    lambda: torch.normal(torch.full((N,), 1.5), 2.0),
    ("aten.normal.Tensor_float",),
    FINITE,
    **NORMAL,
    opsets=("core_aten", "prims"),
)
CASES["normal(Tensor, float, out=)"] = Case(
    lambda: torch.normal(torch.full((N,), 1.5), 2.0, out=_empty()),
    ("aten.normal.Tensor_float_out",),
    FINITE,
    **NORMAL,
)
CASES["normal(float, Tensor)"] = Case(
    lambda: torch.normal(1.5, torch.full((N,), 2.0)),
    ("aten.normal.float_Tensor",),
    FINITE,
    **NORMAL,
    opsets=("core_aten", "prims"),
)
CASES["normal(float, Tensor, out=)"] = Case(
    lambda: torch.normal(1.5, torch.full((N,), 2.0), out=_empty(n=0)),
    ("aten.normal.float_Tensor_out",),
    FINITE,
    **NORMAL,
)
CASES["normal(Tensor, Tensor)"] = Case(
    lambda: torch.normal(torch.full((N,), 1.5), torch.full((N,), 2.0)),
    ("aten.normal.Tensor_Tensor",),
    FINITE,
    **NORMAL,
    opsets=("core_aten", "prims"),
)
CASES["normal(Tensor, Tensor, out=)"] = Case(
    lambda: torch.normal(torch.full((N,), 1.5), torch.full((N,), 2.0), out=_empty(n=0)),
    ("aten.normal.Tensor_Tensor_out",),
    FINITE,
    **NORMAL,
)
CASES["normal(Tensor mean, Tensor std) varying"] = Case(
    # means and stds per position: standardized by them, the values are N(0, 1)
    lambda: torch.normal(torch.linspace(-3, 3, N), torch.linspace(0.5, 4, N)),
    ("aten.normal.Tensor_Tensor",),
    FINITE,
    _normal_cdf(0.0, 1.0),
    moments=(0.0, 1.0),
    view=lambda out: as_units((out - torch.linspace(-3, 3, N)) / torch.linspace(0.5, 4, N), UNITS),
)
CASES["normal(float, float, size)"] = Case(
    lambda: torch.normal(1.5, 2.0, size=(N,)),
    ("aten.normal.float_float",),
    FINITE,
    **NORMAL,
    opsets=("core_aten", "prims"),
)
CASES["normal(float, float, size, out=)"] = Case(
    lambda: torch.normal(1.5, 2.0, size=(N,), out=_empty()), ("aten.normal.float_float_out",), FINITE, **NORMAL
)
CASES["normal.out"] = Case(
    lambda: aten.normal.out(_empty(), 1.5, 2.0, out=_empty()), ("aten.normal.out",), FINITE, **NORMAL
)
CASES["normal_functional"] = Case(
    lambda: aten.normal_functional(_empty(), 1.5, 2.0), ("aten.normal_functional.default",), FINITE, **NORMAL
)
STANDARD = dict(cdf=_normal_cdf(0.0, 1.0), moments=(0.0, 1.0))
CASES["randn"] = Case(
    lambda: torch.randn(N), ("aten.randn.default",), FINITE, **STANDARD, opsets=("core_aten", "prims")
)
CASES["randn(out=)"] = Case(
    lambda: torch.randn(N, out=_empty()), ("aten.randn.out",), FINITE, **STANDARD, opsets=("core_aten", "prims")
)
_float_family(
    "randn_like",
    lambda dt: torch.randn_like(_empty(dt)),
    ("aten.randn_like.default",),
    STANDARD,
    FINITE,
    dtypes=(F32, F64, BF16),
    opsets=("core_aten", "prims"),
)

# exponential, cauchy, log-normal
POSITIVE = _all(lambda x: x > 0)
EXPONENTIAL = dict(cdf=_exponential_cdf(2.0), moments=(0.5, 0.25))
_float_family(
    "exponential_",
    lambda dt: _empty(dt).exponential_(2.0),
    ("aten.exponential_.default",),
    EXPONENTIAL,
    _all(lambda x: x >= 0),  # a reduced dtype rounds the smallest draws to 0, as eager does
)
CASES["exponential_ float32 > 0"] = Case(
    lambda: _empty().exponential_(2.0), ("aten.exponential_.default",), POSITIVE, **EXPONENTIAL
)
CASES["exponential"] = Case(
    lambda: aten.exponential(_empty(), 2.0), ("aten.exponential.default",), POSITIVE, **EXPONENTIAL
)
CASES["exponential.out"] = Case(
    lambda: aten.exponential.out(_empty(), 2.0, out=_empty()), ("aten.exponential.out",), POSITIVE, **EXPONENTIAL
)
CAUCHY = dict(cdf=_cauchy_cdf(1.0, 2.0))  # no moments
_float_family(  # half precision overflows to +-inf in the tails, as eager does
    "cauchy_", lambda dt: _empty(dt).cauchy_(1.0, 2.0), ("aten.cauchy_.default",), CAUCHY, _all(lambda x: ~x.isnan())
)
CASES["cauchy"] = Case(lambda: aten.cauchy(_empty(), 1.0, 2.0), ("aten.cauchy.default",), FINITE, **CAUCHY)
CASES["cauchy.out"] = Case(
    lambda: aten.cauchy.out(_empty(), 1.0, 2.0, out=_empty()), ("aten.cauchy.out",), FINITE, **CAUCHY
)
LOG_NORMAL = dict(
    cdf=_log_normal_cdf(0.5, 0.75),
    moments=(math.exp(0.5 + 0.75**2 / 2), math.expm1(0.75**2) * math.exp(2 * 0.5 + 0.75**2)),
)
_float_family(
    "log_normal_",
    lambda dt: _empty(dt).log_normal_(0.5, 0.75),
    ("aten.log_normal_.default",),
    LOG_NORMAL,
    POSITIVE,
    opsets=("core_aten", "prims"),
)
CASES["log_normal"] = Case(
    lambda: aten.log_normal(_empty(), 0.5, 0.75), ("aten.log_normal.default",), POSITIVE, **LOG_NORMAL
)
CASES["log_normal.out"] = Case(
    lambda: aten.log_normal.out(_empty(), 0.5, 0.75, out=_empty()),
    ("aten.log_normal.out",),
    POSITIVE,
    **LOG_NORMAL,
    opsets=("core_aten", "prims"),
)

# geometric: integers >= 1, at float and integer dtypes
GEOMETRIC = dict(cdf=_geometric_cdf(0.3), lattice=True, moments=(1 / 0.3, 0.7 / 0.09))
AT_LEAST_ONE = _all(lambda x: _integral(x) & (x >= 1))
for _dt in (F32, F64, torch.int64, torch.int32):
    CASES[f"geometric_ {str(_dt).removeprefix('torch.')}"] = Case(
        lambda dt=_dt: _empty(dt).geometric_(0.3),
        ("aten.geometric_.default",),
        AT_LEAST_ONE,
        **GEOMETRIC,
    )
CASES["geometric"] = Case(lambda: aten.geometric(_empty(), 0.3), ("aten.geometric.default",), AT_LEAST_ONE, **GEOMETRIC)
CASES["geometric.out"] = Case(
    lambda: aten.geometric.out(_empty(), 0.3, out=_empty()), ("aten.geometric.out",), AT_LEAST_ONE, **GEOMETRIC
)

# bernoulli: {0, 1}, every overload, float and integer dtypes
BERNOULLI = dict(cdf=_table_cdf([0.7, 0.3]), lattice=True, moments=(0.3, 0.21))
BIT = _values_in(0, 1)
for _dt in (F32, F64, BF16, F16, torch.int64, torch.uint8, torch.bool):
    CASES[f"bernoulli_(float) {str(_dt).removeprefix('torch.')}"] = Case(
        lambda dt=_dt: torch.zeros(N, dtype=dt).bernoulli_(0.3), ("aten.bernoulli_.float",), BIT, **BERNOULLI
    )
_P = lambda: torch.full((N,), 0.3)  # noqa: E731
CASES["bernoulli_(Tensor)"] = Case(lambda: _empty().bernoulli_(_P()), ("aten.bernoulli_.Tensor",), BIT, **BERNOULLI)
CASES["bernoulli(Tensor)"] = Case(lambda: torch.bernoulli(_P()), ("aten.bernoulli.default",), BIT, **BERNOULLI)
CASES["bernoulli(Tensor) float64"] = Case(
    lambda: torch.bernoulli(_P().double()), ("aten.bernoulli.default",), BIT, **BERNOULLI
)
CASES["bernoulli(Tensor, out=)"] = Case(
    lambda: torch.bernoulli(_P(), out=_empty()), ("aten.bernoulli.out",), BIT, **BERNOULLI
)
CASES["bernoulli(x, p)"] = Case(lambda: torch.bernoulli(_empty(), p=0.3), ("aten.bernoulli.p",), BIT, **BERNOULLI)
CASES["bernoulli(x, p) bfloat16"] = Case(
    lambda: torch.bernoulli(_empty(BF16), p=0.3), ("aten.bernoulli.p",), BIT, **BERNOULLI
)
CASES["bernoulli.Tensor"] = Case(
    lambda: aten.bernoulli.Tensor(_empty(), _P()), ("aten.bernoulli.Tensor",), BIT, **BERNOULLI
)
CASES["bernoulli.Tensor_out"] = Case(
    lambda: aten.bernoulli.Tensor_out(_empty(), _P(), out=_empty()), ("aten.bernoulli.Tensor_out",), BIT, **BERNOULLI
)
CASES["bernoulli.float_out"] = Case(
    lambda: aten.bernoulli.float_out(_empty(), 0.3, out=_empty()), ("aten.bernoulli.float_out",), BIT, **BERNOULLI
)
CASES["bernoulli(Tensor) varying p"] = Case(
    # p alternates 0.2, 0.7: the positions drawn at 0.7 are Bernoulli(0.7)
    lambda: torch.bernoulli(torch.tensor([0.2, 0.7]).repeat(N)),
    ("aten.bernoulli.default",),
    BIT,
    _table_cdf([0.3, 0.7]),
    lattice=True,
    moments=(0.7, 0.21),
    view=lambda out: as_units(out[1::2], UNITS),
)

# random_: [0, 2**digits] (floats), the dtype's range (integers), [0, to), [from, to)
_HIGH = {
    torch.uint8: 256,
    torch.int8: 2**7,
    torch.int16: 2**15,
    torch.int32: 2**31,
    torch.bool: 2,
    F32: 2**24 + 1,
    F64: 2**53 + 1,
    BF16: 2**8 + 1,
    F16: 2**11 + 1,
}


def _integers(low, high):
    return dict(
        support=_int_range(low, high),
        cdf=_integers_cdf(low, high),
        lattice=True,
        moments=((low + high - 1) / 2, ((high - low) ** 2 - 1) / 12),
    )


# NOTE: random_() on int64 needs 63 random bits, more than the decomposition's float64 draw
# holds: it declines (UnsupportedOpError, a clear refusal), so int64 has no case here
for _dt, _high in _HIGH.items():
    CASES[f"random_ {str(_dt).removeprefix('torch.')}"] = Case(
        lambda dt=_dt: _empty(dt).random_(), ("aten.random_.default",), **_integers(0, _high)
    )
CASES["random_(to)"] = Case(lambda: _empty().random_(10), ("aten.random_.to",), **_integers(0, 10))
CASES["random_(to) int64"] = Case(
    lambda: _empty(torch.int64).random_(2**40), ("aten.random_.to",), **_integers(0, 2**40)
)
CASES["random_(from, to)"] = Case(lambda: _empty().random_(-3, 7), ("aten.random_.from",), **_integers(-3, 7))
CASES["random_(from, None) int16"] = Case(
    lambda: _empty(torch.int16).random_(-5, None), ("aten.random_.from",), **_integers(-5, 2**15)
)
CASES["random"] = Case(lambda: aten.random(_empty(torch.int32)), ("aten.random.default",), **_integers(0, 2**31))
CASES["random.to"] = Case(lambda: aten.random.to(_empty(), 10), ("aten.random.to",), **_integers(0, 10))
CASES["random.from"] = Case(
    lambda: getattr(aten.random, "from")(_empty(), -3, 7), ("aten.random.from",), **_integers(-3, 7)
)
CASES["random.out"] = Case(
    lambda: aten.random.out(_empty(torch.uint8), out=_empty(torch.uint8)), ("aten.random.out",), **_integers(0, 256)
)
CASES["random.to_out"] = Case(
    lambda: aten.random.to_out(_empty(), 10, out=_empty()), ("aten.random.to_out",), **_integers(0, 10)
)
CASES["random.from_out"] = Case(
    lambda: aten.random.from_out(_empty(), -3, 7, out=_empty()), ("aten.random.from_out",), **_integers(-3, 7)
)

# randint and randint_like: [low, high)
CASES["randint(high)"] = Case(lambda: torch.randint(10, (N,)), ("aten.randint.default",), **_integers(0, 10))
CASES["randint(low, high)"] = Case(lambda: torch.randint(-3, 7, (N,)), ("aten.randint.low",), **_integers(-3, 7))
CASES["randint(low, high) int32"] = Case(
    lambda: torch.randint(-3, 7, (N,), dtype=torch.int32), ("aten.randint.low",), **_integers(-3, 7)
)
CASES["randint(low, high) float32"] = Case(
    lambda: torch.randint(-3, 7, (N,), dtype=F32), ("aten.randint.low",), **_integers(-3, 7)
)
CASES["randint wide"] = Case(
    lambda: torch.randint(-(2**40), 2**40, (N,)), ("aten.randint.low",), **_integers(-(2**40), 2**40)
)
for _dt in (torch.int64, torch.uint8, F32, BF16):
    _name = str(_dt).removeprefix("torch.")
    CASES[f"randint_like(high) {_name}"] = Case(
        lambda dt=_dt: torch.randint_like(_empty(dt), 10), ("aten.randint_like.default",), **_integers(0, 10)
    )
CASES["randint_like(low, high)"] = Case(
    lambda: torch.randint_like(_empty(), -3, 7), ("aten.randint_like.low_dtype",), **_integers(-3, 7)
)
CASES["randint_like(low, high, dtype)"] = Case(
    lambda: torch.randint_like(_empty(), -3, 7, dtype=torch.int16), ("aten.randint_like.low_dtype",), **_integers(-3, 7)
)

# randperm: each row a permutation; position 0 uniform over 0 .. 19
PERMUTATION = lambda out: bool((_first(out).sort(-1).values == torch.arange(20)).all())  # noqa: E731
CASES["randperm"] = Case(
    lambda: torch.stack([torch.randperm(20) for _ in range(UNITS)]),
    ("aten.randperm.default",),
    PERMUTATION,
    _integers_cdf(0, 20),
    lattice=True,
    view=lambda out: out[:, :1],
)
CASES["randperm(out=)"] = Case(
    lambda: torch.stack([torch.randperm(20, out=torch.empty(0, dtype=torch.int32)) for _ in range(UNITS)]),
    ("aten.randperm.out",),
    PERMUTATION,
    _integers_cdf(0, 20),
    lattice=True,
    view=lambda out: out[:, :1],
)


# explicit generators (rng.py lends their state to the default generator for one draw): the
# generator is seeded from the case's seed, so the two-sample test's second seed changes it too
def _gen():
    return torch.Generator().manual_seed(torch.initial_seed() + 1)


RAND = dict(cdf=_uniform_cdf(0, 1), moments=(0.5, 1 / 12))
RANDN = dict(cdf=_normal_cdf(0.0, 1.0), moments=(0.0, 1.0))
CASES["rand(generator=)"] = Case(
    lambda: torch.rand(N, generator=_gen()), ("aten.rand.generator",), _in(0.0, 1.0), **RAND
)
CASES["rand(generator=, out=)"] = Case(
    lambda: torch.rand(N, generator=_gen(), out=_empty()), ("aten.rand.generator_out",), _in(0.0, 1.0), **RAND
)
CASES["randn(generator=)"] = Case(lambda: torch.randn(N, generator=_gen()), ("aten.randn.generator",), FINITE, **RANDN)
CASES["randn(generator=, out=)"] = Case(
    lambda: torch.randn(N, generator=_gen(), out=_empty()), ("aten.randn.generator_out",), FINITE, **RANDN
)
CASES["rand_like(generator=)"] = Case(
    lambda: aten.rand_like.generator(_empty(), generator=_gen()), ("aten.rand_like.generator",), _in(0.0, 1.0), **RAND
)
CASES["randn_like(generator=)"] = Case(
    lambda: aten.randn_like.generator(_empty(), generator=_gen()), ("aten.randn_like.generator",), FINITE, **RANDN
)
CASES["randint(high, generator=)"] = Case(
    lambda: torch.randint(10, (N,), generator=_gen()), ("aten.randint.generator",), **_integers(0, 10)
)
CASES["randint(low, high, generator=)"] = Case(
    lambda: torch.randint(-3, 7, (N,), generator=_gen()), ("aten.randint.low_generator",), **_integers(-3, 7)
)
CASES["randint_like(high, generator=)"] = Case(
    lambda: aten.randint_like.generator(_empty(), 10, generator=_gen()),
    ("aten.randint_like.generator",),
    **_integers(0, 10),
)
CASES["randint_like(low, high, generator=)"] = Case(
    lambda: aten.randint_like.low_generator_dtype(_empty(), -3, 7, generator=_gen()),
    ("aten.randint_like.low_generator_dtype",),
    **_integers(-3, 7),
)
CASES["randperm(generator=)"] = Case(
    lambda: torch.stack(
        [torch.randperm(20, generator=_gen().manual_seed(torch.initial_seed() + i)) for i in range(UNITS)]
    ),
    ("aten.randperm.generator",),
    PERMUTATION,
    _integers_cdf(0, 20),
    lattice=True,
    view=lambda out: out[:, :1],
)
CASES["randperm(generator=, out=)"] = Case(
    lambda: torch.stack(
        [
            torch.randperm(
                20, generator=_gen().manual_seed(torch.initial_seed() + i), out=torch.empty(0, dtype=torch.int64)
            )
            for i in range(UNITS)
        ]
    ),
    ("aten.randperm.generator_out",),
    PERMUTATION,
    _integers_cdf(0, 20),
    lattice=True,
    view=lambda out: out[:, :1],
)

# multinomial: with replacement (every draw from probs), without (the first pick from probs;
# no category twice in a row); a zero-probability category is never drawn
PROBS = [0.1, 0.0, 0.2, 0.3, 0.4]
NEVER_ZERO = lambda x: (x >= 0) & (x < len(PROBS)) & (x != 1)  # noqa: E731
CASES["multinomial(replacement) 1-d"] = Case(
    lambda: torch.multinomial(torch.tensor(PROBS), N, True),
    ("aten.multinomial.default",),
    _all(NEVER_ZERO),
    _table_cdf(PROBS),
    lattice=True,
)
CASES["multinomial(replacement) 2-d"] = Case(
    lambda: torch.multinomial(torch.tensor(PROBS).repeat(UNITS, 1) * 3, 100, True),
    ("aten.multinomial.default",),
    _all(NEVER_ZERO),
    _table_cdf(PROBS),
    lattice=True,
)
CASES["multinomial(replacement, out=)"] = Case(
    lambda: torch.multinomial(torch.tensor(PROBS), N, True, out=torch.empty(0, dtype=torch.int64)),
    ("aten.multinomial.out",),
    _all(NEVER_ZERO),
    _table_cdf(PROBS),
    lattice=True,
)


def _distinct_rows(out):
    s = _first(out).sort(-1).values
    return bool((s[..., 1:] != s[..., :-1]).all()) and bool(NEVER_ZERO(_first(out).double()).all())


for _k in range(3):
    # the k-th pick of 3 without replacement from 20,000 rows (the first pick's law is PROBS)
    CASES[f"multinomial(no replacement) pick {_k}"] = Case(
        lambda: torch.multinomial(torch.tensor(PROBS).repeat(20 * UNITS, 1), 3),
        ("aten.multinomial.default",),
        _distinct_rows,
        _table_cdf(PROBS) if _k == 0 else None,
        lattice=True,
        view=lambda out, k=_k: as_units(out[:, k], UNITS),
    )
CASES["multinomial(no replacement, out=) 1-d"] = Case(
    lambda: torch.stack(
        [torch.multinomial(torch.tensor(PROBS), 2, out=torch.empty(0, dtype=torch.int64)) for _ in range(UNITS)]
    ),
    ("aten.multinomial.out",),
    _distinct_rows,
    _table_cdf(PROBS),
    lattice=True,
    view=lambda out: out[:, :1],
)

# the samplers: poisson, binomial, gamma, dirichlet
CASES["poisson"] = Case(
    lambda: torch.poisson(torch.full((SMALL,), 3.0)),
    ("aten.poisson.default",),
    _all(lambda x: _integral(x) & (x >= 0)),
    _poisson_cdf(3.0),
    lattice=True,
    moments=(3.0, 3.0),
)
CASES["poisson.out"] = Case(
    lambda: aten.poisson.out(torch.full((SMALL,), 3.0), out=_empty(n=SMALL)),
    ("aten.poisson.out",),
    _all(lambda x: _integral(x) & (x >= 0)),
    _poisson_cdf(3.0),
    lattice=True,
    moments=(3.0, 3.0),
)
BINOMIAL = dict(cdf=_table_cdf(_binomial_probs(20, 0.3)), lattice=True, moments=(6.0, 4.2))
COUNTS = _all(lambda x: _integral(x) & (x >= 0) & (x <= 20))
CASES["binomial"] = Case(
    lambda: torch.binomial(torch.full((SMALL,), 20.0), torch.full((SMALL,), 0.3)),
    ("aten.binomial.default",),
    COUNTS,
    **BINOMIAL,
)
CASES["binomial.out"] = Case(
    lambda: aten.binomial.out(torch.full((SMALL,), 20.0), torch.full((SMALL,), 0.3), out=_empty(n=SMALL)),
    ("aten.binomial.out",),
    COUNTS,
    **BINOMIAL,
)
for _alpha in (0.7, 3.0):
    for _dt in (F32, F64):
        CASES[f"_standard_gamma({_alpha}) {str(_dt).removeprefix('torch.')}"] = Case(
            lambda a=_alpha, dt=_dt: torch._standard_gamma(torch.full((SMALL,), a, dtype=dt)),
            ("aten._standard_gamma.default",),
            _all(lambda x: x >= 0),
            _gamma_cdf(_alpha),
            moments=(_alpha, _alpha),
        )
CASES["_standard_gamma.out"] = Case(
    lambda: aten._standard_gamma.out(torch.full((SMALL,), 0.7), out=_empty(n=SMALL)),
    ("aten._standard_gamma.out",),
    _all(lambda x: x >= 0),
    _gamma_cdf(0.7),
    moments=(0.7, 0.7),
)
ALPHAS = [0.5, 1.0, 2.5]


def _simplex(out):
    x = _first(out).double()
    return bool(((x >= 0) & (x <= 1)).all()) and bool(((x.sum(-1) - 1).abs() < 1e-5).all())


for _col, _a in enumerate(ALPHAS):
    # each coordinate is Beta(a_i, sum(a) - a_i): mean a_i / a0, variance a_i (a0 - a_i) / (a0**2 (a0 + 1))
    _a0 = sum(ALPHAS)
    CASES[f"_sample_dirichlet coordinate {_col}"] = Case(
        lambda: torch._sample_dirichlet(torch.tensor(ALPHAS).repeat(10 * UNITS, 1)),
        ("aten._sample_dirichlet.default",),
        _simplex,
        moments=(_a / _a0, _a * (_a0 - _a) / (_a0**2 * (_a0 + 1))),
        view=lambda out, c=_col: as_units(out[:, c], UNITS),
    )
CASES["_sample_dirichlet.out"] = Case(
    lambda: aten._sample_dirichlet.out(torch.tensor(ALPHAS).repeat(10 * UNITS, 1), out=torch.empty(0)),
    ("aten._sample_dirichlet.out",),
    _simplex,
    moments=(0.5 / 4, 0.5 * 3.5 / (16 * 5)),
    view=lambda out: as_units(out[:, 0], UNITS),
)

# rrelu: on negative inputs the slope is U(lower, upper), written to the noise too
RRELU = dict(cdf=_uniform_cdf(0.1, 0.3), moments=(0.2, 0.04 / 12))


def _slopes(out):
    """``-out`` on an input of -1: the drawn slopes (and the noise holds them: checked by support)."""
    return as_units(-_first(out), UNITS)


def _rrelu_support(out):
    result, noise = out if isinstance(out, tuple) else (out, None)
    ok = bool(((-result >= 0.1) & (-result <= 0.3)).all())
    return ok and (noise is None or torch.equal(noise, -result))


def _rrelu_with_noise(op):
    def draw():
        noise = torch.empty(N)
        return op(-torch.ones(N), noise, 0.1, 0.3, True), noise

    return draw


CASES["rrelu_with_noise"] = Case(
    _rrelu_with_noise(aten.rrelu_with_noise), ("aten.rrelu_with_noise.default",), _rrelu_support, **RRELU, view=_slopes
)
CASES["rrelu_with_noise_"] = Case(
    _rrelu_with_noise(aten.rrelu_with_noise_),
    ("aten.rrelu_with_noise_.default",),
    _rrelu_support,
    **RRELU,
    view=_slopes,
)
CASES["rrelu"] = Case(
    lambda: F.rrelu(-torch.ones(N), 0.1, 0.3, training=True),
    ("aten.rrelu.default",),
    _rrelu_support,
    **RRELU,
    view=_slopes,
)
CASES["rrelu_"] = Case(
    lambda: F.rrelu(-torch.ones(N), 0.1, 0.3, training=True, inplace=True),
    ("aten.rrelu_.default",),
    _rrelu_support,
    **RRELU,
    view=_slopes,
)

# dropout: on ones, a kept element is 1 / (1 - p) (Bernoulli(1 - p) once scaled by 1 - p)
KEPT = dict(cdf=_table_cdf([0.3, 0.7]), lattice=True, moments=(0.7, 0.21))
SCALED = lambda out: as_units(_first(out) * 0.7, UNITS)  # noqa: E731
DROPPED_OR_KEPT = _all(lambda x: (x == 0) | ((x - 1 / 0.7).abs() < 1e-6))
CASES["dropout"] = Case(
    lambda: F.dropout(torch.ones(N), 0.3), ("aten.dropout.default",), DROPPED_OR_KEPT, **KEPT, view=SCALED
)
CASES["dropout_"] = Case(
    lambda: F.dropout(torch.ones(N), 0.3, inplace=True),
    ("aten.dropout_.default",),
    DROPPED_OR_KEPT,
    **KEPT,
    view=SCALED,
)
CASES["native_dropout"] = Case(
    lambda: aten.native_dropout(torch.ones(N), 0.3, True),
    ("aten.native_dropout.default",),
    DROPPED_OR_KEPT,
    **KEPT,
    view=SCALED,
)
CASES["native_dropout.out"] = Case(
    lambda: aten.native_dropout.out(torch.ones(N), 0.3, True, out0=_empty(), out1=torch.empty(N, dtype=torch.bool)),
    ("aten.native_dropout.out",),
    DROPPED_OR_KEPT,
    **KEPT,
    view=SCALED,
)


def _channels(out):
    """dropout2d on [UNITS, 10 channels, 10]: one draw per channel (its first element)."""
    return as_units(_first(out)[:, :, 0] * 0.7, UNITS)


def _whole_channels(out):
    x = _first(out)
    return bool((x == x[:, :, :1]).all()) and DROPPED_OR_KEPT(x)


CASES["feature_dropout (dropout2d)"] = Case(
    lambda: F.dropout2d(torch.ones(UNITS, 10, 10, 1), 0.3),
    ("aten.feature_dropout.default",),
    _whole_channels,
    **KEPT,
    view=_channels,
)
CASES["feature_dropout_"] = Case(
    lambda: F.dropout2d(torch.ones(UNITS, 10, 10, 1), 0.3, inplace=True),
    ("aten.feature_dropout_.default",),
    _whole_channels,
    **KEPT,
    view=_channels,
)


def _alpha_kept(out):
    """alpha dropout on ones: kept elements take the larger of its two values."""
    x = _first(out)
    return as_units(x == x.max(), UNITS)


def _two_values(out):
    return _first(out).unique().numel() <= 2


CASES["alpha_dropout"] = Case(
    lambda: F.alpha_dropout(torch.ones(N), 0.3, True),
    ("aten.alpha_dropout.default",),
    _two_values,
    **KEPT,
    view=_alpha_kept,
)
CASES["alpha_dropout_"] = Case(
    lambda: F.alpha_dropout(torch.ones(N), 0.3, True, inplace=True),
    ("aten.alpha_dropout_.default",),
    _two_values,
    **KEPT,
    view=_alpha_kept,
)
CASES["feature_alpha_dropout"] = Case(
    lambda: F.feature_alpha_dropout(torch.ones(UNITS, 100, 1), 0.3, True),
    ("aten.feature_alpha_dropout.default",),
    _two_values,
    **KEPT,
    view=_alpha_kept,
)
CASES["feature_alpha_dropout_"] = Case(
    lambda: F.feature_alpha_dropout(torch.ones(UNITS, 100, 1), 0.3, True, inplace=True),
    ("aten.feature_alpha_dropout_.default",),
    _two_values,
    **KEPT,
    view=_alpha_kept,
)

# attention dropout: with equal scores and values of 1, a query row's output is the number of
# its 64 keys kept, divided by 64 (1 - p): Binomial(64, 0.7) once scaled back
_Q = lambda: torch.ones(UNITS, 1, 64, 1)  # noqa: E731
ATTENTION = dict(cdf=_table_cdf(_binomial_probs(64, 0.7)), lattice=True, moments=(64 * 0.7, 64 * 0.21))


def _kept_keys(out):
    return as_units(torch.round(_first(out) * 64 * 0.7), UNITS)


def _kept_counts(out):
    k = torch.round(_first(out).double() * 64 * 0.7)
    return bool(((k >= 0) & (k <= 64) & ((_first(out).double() * 64 * 0.7 - k).abs() < 1e-3)).all())


CASES["scaled_dot_product_attention(dropout_p)"] = Case(
    lambda: F.scaled_dot_product_attention(_Q(), _Q(), _Q(), dropout_p=0.3),
    ("aten.scaled_dot_product_attention.default",),
    _kept_counts,
    **ATTENTION,
    view=_kept_keys,
)
CASES["_scaled_dot_product_attention_math(dropout_p)"] = Case(
    lambda: aten._scaled_dot_product_attention_math(_Q(), _Q(), _Q(), dropout_p=0.3),
    ("aten._scaled_dot_product_attention_math.default",),
    _kept_counts,
    **ATTENTION,
    view=_kept_keys,
)


# -- the ops left out, each with its reason -------------------------------------------------------

_NO_CPU_KERNEL = "a CUDA/MPS/cuDNN/MIOpen kernel only: no CPU call to compare (eager raises on CPU)"
_RNN = (
    "draws only through dropout= between layers, which runs aten.dropout (its cases above); "
    "the recurrence itself is deterministic"
)
EXCLUDED = {
    **dict.fromkeys(
        [
            "aten._cudnn_rnn.out",
            "aten._fused_dropout.default",
            "aten._fused_dropout.out",
            "aten._lstm_mps.out",
            "aten._scaled_dot_product_cudnn_attention.default",
            "aten._scaled_dot_product_cudnn_attention_backward.default",
            "aten._scaled_dot_product_efficient_attention.default",
            "aten._scaled_dot_product_efficient_attention_backward.default",
            "aten._scaled_dot_product_flash_attention.default",
            "aten._triton_scaled_dot_attention.out",
            "aten.miopen_rnn.out",
        ],
        _NO_CPU_KERNEL,
    ),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "its CPU kernel refuses dropout_p > 0: without "
    "dropout it draws nothing (tests/decompositions/test_attention.py)",
    **dict.fromkeys(
        [
            "aten.gru.data",
            "aten.gru.input",
            "aten.lstm.data",
            "aten.lstm.input",
            "aten.rnn_relu.data",
            "aten.rnn_relu.input",
            "aten.rnn_tanh.data",
            "aten.rnn_tanh.input",
        ],
        _RNN,
    ),
}


def _has_composite_kernel(op) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def random_ops_with_a_path(opset: str) -> dict:
    """``{name: op}``: the seeded aten ops the mode can route under ``opset`` (in it, in its
    decomposition table, or decomposed by a CompositeImplicit kernel above the mode)."""
    ops = OpSet.preset(opset)
    table = default_table(ops)
    return {
        str(op): op
        for op in overloads("aten")
        if torch.Tag.nondeterministic_seeded in op.tags and (op in ops.ops or op in table or _has_composite_kernel(op))
    }


def test_every_random_op_with_a_path_has_a_case():
    ops = random_ops_with_a_path("core_aten")
    covered = {op for case in CASES.values() for op in case.ops}
    missing = sorted(set(ops) - covered - set(EXCLUDED))
    assert not missing, f"random ops with a path and no case (add one to CASES, or a reason to EXCLUDED): {missing}"
    assert not covered & set(EXCLUDED), sorted(covered & set(EXCLUDED))
    assert not covered - set(ops), f"cases name ops without a path: {sorted(covered - set(ops))}"
    assert set(EXCLUDED) <= set(ops), f"stale exclusions: {sorted(set(EXCLUDED) - set(ops))}"


# -- one case ---------------------------------------------------------------------------------------


def _tensors(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _bitwise(a, b) -> bool:
    return all(
        torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())
        if x.is_floating_point()
        else torch.equal(x, y)
        for x, y in zip(_tensors(a), _tensors(b))
    )


def _under_mode(case, opset, seed):
    torch.manual_seed(seed)
    with RecordingMode() as rec, ed.EagerDecompMode(opset) as mode:
        out = case.draw()
    rec.assert_only(opset)
    return out, mode


def _native(case, seed):
    torch.manual_seed(seed)
    return case.draw()


def check_case(case: Case, opset: str = "core_aten") -> str | None:
    """Every check of one case: ``None``, or what failed (a message naming eager's and our value)."""
    native = _native(case, SEED)
    ours, mode = _under_mode(case, opset, SEED)
    n, o = _tensors(native), _tensors(ours)
    if len(n) != len(o):
        return f"{len(o)} outputs, eager {len(n)}"
    for i, (x, y) in enumerate(zip(n, o)):
        if (x.dtype, x.shape, x.stride(), x.device) != (y.dtype, y.shape, y.stride(), y.device):
            ours_meta, eager_meta = (y.dtype, list(y.shape), y.stride()), (x.dtype, list(x.shape), x.stride())
            return f"output {i}: (dtype, shape, strides) {ours_meta}, eager {eager_meta}"
    seen = {row.op for row in mode.report().rows if row.calls}
    unseen = [op for op in case.ops if op not in seen and not _has_composite_kernel(_op(op))]
    if unseen:
        return f"the case never called {unseen} under the mode (it saw {sorted(seen)})"
    again, _ = _under_mode(case, opset, SEED)
    if not _bitwise(ours, again):
        return "not reproducible under torch.manual_seed"
    if _bitwise(native, ours):
        return None  # eager's own numbers: nothing weaker to check
    if case.support is not None:
        if not case.support(native):
            raise AssertionError("the case's support does not hold for eager's own draw: fix the case")
        if not case.support(ours):
            return "a value outside the support"
    view = case.view or _units
    eager_law = view(_native(case, OTHER_SEED))  # independent of ours: the sign-flip test needs it
    problem = same_distribution(eager_law, view(ours))
    if problem:
        return problem
    reduced = any(t.dtype in REDUCED for t in o)
    if case.cdf is not None and not reduced:
        if matches_cdf(view(native), case.cdf, case.lattice):
            raise AssertionError(
                f"eager's own draw does not follow the case's law: {matches_cdf(view(native), case.cdf, case.lattice)}"
            )
        problem = matches_cdf(view(ours), case.cdf, case.lattice)
        if problem:
            return problem
    if case.moments is not None and not reduced:
        if moments_match(view(native), *case.moments):
            raise AssertionError(
                f"eager's own draw misses the case's moments: {moments_match(view(native), *case.moments)}"
            )
        return moments_match(view(ours), *case.moments)
    return None


def _op(name: str):
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


PARAMS = [pytest.param(name, opset, id=f"{name}-{opset}") for name, case in CASES.items() for opset in case.opsets]


@pytest.mark.parametrize("name,opset", PARAMS)
def test_random_op_draws_eagers_numbers_or_eagers_distribution(name, opset):
    problem = check_case(CASES[name], opset)
    assert problem is None, f"{name} under {opset}: {problem}"


# -- the planted defect of issue 50 --------------------------------------------------------------------


def test_a_planted_normal_defect_fails_the_distribution_checks():
    names = [n for n, case in CASES.items() if set(NORMAL_OPS) & set(case.ops)]
    assert len(names) >= 10, names
    undo = plant_normal_defect()
    try:
        missed = [n for n in names if check_case(CASES[n]) is None]
    finally:
        undo()
    assert not missed, f"the planted normal defect passed {missed}"
    assert check_case(CASES["normal(Tensor, Tensor)"]) is None  # and the real one passes again
