"""Fills for elementwise float anatomy, shifts, angle, stable sort, logcumsumexp and ones/zeros out=,
against native eager: values (exact unless noted), dtypes, shapes, strides; only core ops below."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode
from tests.compare import check_against_eager


def _check(fn, *args, exact=True):
    check_against_eager(fn, *args, exact=exact)


FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
EDGES = {  # smallest subnormal, a subnormal, largest finite, smallest normal
    torch.float32: [1e-45, -1e-40, 3.4028234663852886e38, 2.0**-126],
    torch.float64: [5e-324, -1e-310, 1.7976931348623157e308, 2.0**-1022],
}


def _values(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, dtype=torch.float64, generator=g) * 10.0 ** torch.randint(-30, 30, (50,), generator=g)
    special = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, 0.5, 2.0, -4.0] + EDGES.get(dtype, [])
    return torch.cat([x, torch.tensor(special, dtype=torch.float64)]).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_anatomy(dtype):
    x = _values(dtype)
    y = x.flip(0)
    _check(torch.frexp, x)
    _check(torch.angle, x)
    _check(torch.hypot, x, y, exact=dtype != torch.float64)
    for to in (y, torch.zeros_like(x), x * 2, torch.full_like(x, float("inf")), -x):
        _check(torch.nextafter, x, to)
    _check(torch.signbit, x[~x.isnan()])
    _check(torch.copysign, x, x[~x.isnan()][-4:-3])


def test_signbit_declines_nan():
    # the sign of a NaN is unreadable in core ops: declined, never guessed
    with pytest.raises(ed.UnsupportedOpError), ed.EagerDecompMode("core_aten"):
        torch.signbit(torch.tensor([1.0, float("nan")]))


def test_angle_integer():
    _check(torch.angle, torch.tensor([-3, 0, 4]))
    _check(torch.angle, torch.tensor([True, False]))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_shifts_past_the_width(dtype):
    g = torch.Generator().manual_seed(0)
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max, (300,), dtype=dtype, generator=g)
    b = torch.randint(0 if dtype == torch.uint8 else -3, dtype.itemsize * 8 + 3, (300,), dtype=dtype, generator=g)
    for fn in (torch.bitwise_left_shift, torch.bitwise_right_shift):
        _check(fn, a, b)
        _check(fn, a, b[:1].clone())
    for k in (0, 3, 7, 8, 63, 64, 70):
        _check(lambda a: a << k, a)
        _check(lambda a: a >> k, a)
    _check(lambda a, b: a.bitwise_left_shift(b.to(torch.int64)), a, b)  # promoted


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stable_sort(descending, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (5, 37), generator=g).float()
    x[x == 3] = float("nan")
    x[0, :5] = -0.0  # equal to 0.0: kept in index order
    _check(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), x)
    _check(lambda t: torch.argsort(t, dim=dim, descending=descending, stable=True), x)
    _check(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), x.t())
    _check(
        lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), torch.randint(0, 3, (3, 40), generator=g)
    )
    _check(lambda t: torch.sort(t, descending=descending, stable=True), torch.randint(0, 2, (40,), generator=g).bool())
    _check(lambda t: torch.sort(t, stable=True), torch.tensor(3.0))
    _check(lambda t: torch.sort(t, stable=True), torch.randn(0, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logcumsumexp(dtype):
    g = torch.Generator().manual_seed(0)
    y = torch.randn(4, 33, generator=g).to(dtype) * 30
    y[0, 0] = -1000  # a shift by the max would underflow it to -inf
    y[1, 3], y[2, 4], y[3, 5] = float("inf"), -float("inf"), float("nan")
    for dim in (0, 1):
        _check(lambda t: torch.logcumsumexp(t, dim), y, exact=False)
    _check(lambda t: torch.logcumsumexp(t, 0), y.t(), exact=False)
    _check(
        lambda t: torch.logcumsumexp(t, 0), torch.tensor([-float("inf"), -float("inf"), float("inf"), 1.0]), exact=False
    )


@pytest.mark.parametrize("fill", [torch.ones, torch.zeros])
def test_factory_out(fill):
    for out in (torch.empty(6), torch.empty(0, dtype=torch.int64), torch.empty(2, 3, dtype=torch.bool)):
        _check(lambda o: fill((2, 3), out=o), out.zero_())  # returns its out= tensor, resized as eager


_WEIGHTS = [0.0, 0.1, 0.3, 0.5 - 2.0**-30, 0.5, 0.7, 0.9, 1.0, 1.7, -0.3, -2.5, 3, 1e-30, float("nan"), float("inf")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [7, 64, 1000])  # a vector tail, whole vectors, both
def test_lerp_with_a_number_weight_is_bitwise_eager(dtype, n):
    # eager's kernel: fma(coeff, end - start, base), its branch picked by the weight as the
    # dtype holds it; PyTorch's decomposition (where + unfused mul/add) differs by an ulp
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, dtype=dtype, generator=g), torch.randn(n, dtype=dtype, generator=g)
    for w in _WEIGHTS:
        _check(lambda x, y: torch.lerp(x, y, w), a, b)
        _check(lambda x, y: x.clone().lerp_(y, w), a, b)
    _check(lambda x, y: torch.lerp(x, y, 0.3), a[: n - 1 : 2], b[1::2])  # strided operands
    _check(lambda x, y: torch.lerp(x, y, 0.7), a.view(1, n), b.view(n, 1)[:3])  # broadcast


def test_lerp_with_a_number_weight_runs_two_kernels():
    a, b = torch.randn(8), torch.randn(8)
    for w in (0.3, 0.7):
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            torch.lerp(a, b, w)
        assert dict(rec.ops) == {torch.ops.aten.sub.Tensor: 1, torch.ops.aten.add.Tensor: 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [7, 64, 1000])
def test_addcdiv_is_bitwise_eager(dtype, n):
    # eager's kernel multiplies by value before it divides (AdamW's update): so must the decomposition
    g = torch.Generator().manual_seed(n)
    s, a = torch.randn(n, dtype=dtype, generator=g), torch.randn(n, dtype=dtype, generator=g)
    b = torch.rand(n, dtype=dtype, generator=g) + 0.5
    for v in (0.3, -1e-3, 1.0, 2.5, 7, -0.75):
        _check(lambda x, y, z: torch.addcdiv(x, y, z, value=v), s, a, b)
        _check(lambda x, y, z: x.clone().addcdiv_(y, z, value=v), s, a, b)
    _check(
        lambda x, y, z: torch.addcdiv(x, y, z, value=0.3),
        s.view(1, n),
        a.view(n, 1)[:3],
        b[: n - 1 : 2].view(1, -1)[:, :1],
    )
