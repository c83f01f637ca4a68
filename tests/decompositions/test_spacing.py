"""linspace and logspace (eagerdecomp/spacing.py): eager's CPU kernels replayed operation by
operation, bit for bit at every real dtype (logspace at float64: to the core pow's ulp)."""

import math
import warnings

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode
from tests.compare import assert_like_eager, assert_raises_like_eager

DTYPES = [
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
# (start, end, steps): the OpInfo's off-by-one case, float endpoints truncated at integers,
# decreasing ranges, odd and even step counts on both sides of the halfway split
LINSPACE = [(-3.5, 10, 33), (4.3, -2.0, 50), (0, 50, 7), (-71.37, 93.02, 257), (12, 12, 5), (1.1, 2.2, 2), (3, 0, 1)]
LOGSPACE = [(-2.0, 4.3, 50), (4.3, -2.0, 33), (0, 3, 7), (1.7, 2.9, 257), (-1, -1, 4), (0.5, 4, 1)]


def _eq(want, got):
    assert_like_eager(want, got)


def _range_for(dtype, start, end):
    if dtype == torch.uint8:
        return abs(start), abs(end)
    return start, end


def _calls(fn, dtype, start, end, steps, extra):
    yield lambda: fn(start, end, steps, *extra, dtype=dtype)
    yield lambda: fn(torch.tensor(start), torch.tensor(end), steps, *extra, dtype=dtype)  # Tensor_Tensor
    yield lambda: fn(torch.tensor(float(start), dtype=torch.float64), end, steps, *extra, dtype=dtype)  # Tensor_Scalar

    def out():
        o = torch.empty(0, dtype=dtype)
        fn(start, end, steps, *extra, out=o)
        return o

    yield out


def _check(fn, dtype, start, end, steps, extra, exact=True):
    for call in _calls(fn, dtype, start, end, steps, extra):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                want = call()
            except Exception:  # noqa: BLE001 - eager rejects the call: the mode must, with eager's error
                assert_raises_like_eager(call)
                continue
            with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
                got = call()
        rec.assert_only("core_aten")
        if exact:
            _eq(want, got)
        else:  # float64 logspace: the core pow (SLEEF in a CPU's vector lanes) may differ from libm's by an ulp
            assert got.dtype == want.dtype and got.shape == want.shape
            assert bool(((got - want).abs() <= 2 * torch.finfo(torch.float64).eps * want.abs()).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linspace_bitwise(dtype):
    for start, end, steps in LINSPACE:
        start, end = _range_for(dtype, start, end)
        _check(torch.linspace, dtype, start, end, steps, ())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logspace_bitwise(dtype):
    for start, end, steps in LOGSPACE:
        start, end = _range_for(dtype, start, end)
        for base in (10.0, 2.0):
            _check(torch.logspace, dtype, start, end, steps, (base,), exact=dtype != torch.float64)


def test_linspace_fma_cases():
    # values where the kernel's fused multiply-add and a plain product-then-sum round differently
    for dtype in (torch.float32, torch.float64, torch.int64):
        for start, end, steps in [(-86.5, 97.3, 113), (0.1, 0.7, 1001), (-1e4 / 3, 2.5, 700)]:
            want = torch.linspace(start, end, steps, dtype=dtype)
            with ed.EagerDecompMode("core_aten"):
                _eq(want, torch.linspace(start, end, steps, dtype=dtype))


def test_eagers_errors_and_declines():
    for message, call in (
        ("overflow", lambda: torch.linspace(torch.tensor(300.0), 5, 4, dtype=torch.int8)),  # Scalar.to<int8_t>()
        ("overflow", lambda: torch.linspace(torch.tensor(1e300, dtype=torch.float64), 5, 4)),
        ("overflow", lambda: torch.logspace(4, 4, 1, dtype=torch.int8)),  # fill_(pow(10, 4)) into int8
        ("non-negative", lambda: torch.linspace(0, 1, -1)),
    ):
        assert_raises_like_eager(call, message=message)
    with ed.EagerDecompMode("core_aten"):
        with pytest.raises(ed.UnsupportedOpError):  # eager has no bool kernel
            torch.linspace(0, 1, 5, dtype=torch.bool)
        with pytest.raises(ed.UnsupportedOpError):  # eager keeps a [2, 3] out, its meta kernel resizes it
            torch.linspace(0, 1, 6, out=torch.empty(2, 3))


def test_out_resized_and_strided():
    for make in (
        lambda: torch.empty(0, dtype=torch.bfloat16),
        lambda: torch.empty(12, dtype=torch.bfloat16)[::2],
        lambda: torch.empty(3, dtype=torch.bfloat16),
    ):
        want, got = make(), make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.linspace(-3.5, 10, 6, out=want)
            with ed.EagerDecompMode("core_aten"):
                torch.linspace(-3.5, 10, 6, out=got)
        _eq(want, got)


def test_complex_keeps_torchs_path():
    with ed.EagerDecompMode("core_aten"):
        got = torch.linspace(0, 1 + 2j, 5)
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got, torch.linspace(0, 1 + 2j, 5))
    assert math.isclose(abs(complex(got[-1])), abs(1 + 2j), rel_tol=1e-6)
