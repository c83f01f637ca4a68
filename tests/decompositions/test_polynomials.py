"""The orthogonal polynomials of torch.special (polynomials.py) against native eager.

float64 and the recurrences match the kernel within the default tolerances; float32's
closed forms at large degree are held to the accuracy rule (no further from a float64
reference than twice the native kernel's error plus the tolerance). Dtypes, shapes and
strides are eager's, and only core ops run below."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

NAMES = [f"{s}chebyshev_polynomial_{k}" for s in ("", "shifted_") for k in "tuvw"] + [
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]
TOL = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def _under_mode(fn, *args):
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        out = fn(*args)
    rec.assert_only("core_aten")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NAMES)
def test_polynomial(name, dtype):
    fn = getattr(torch.special, name)
    g = torch.Generator().manual_seed(0)
    # the kernels' special points (|x| == 1, x == 0, a tiny x whose 2x - 1 rounds to -1), and
    # degrees negative, fractional, small, past the closed-form thresholds and the Hermite limits
    x = torch.cat(
        [
            torch.randn(120, generator=g, dtype=dtype) * 2,
            torch.tensor([1.0, -1.0, 0.0, 0.5, 2.0, -2.0, 1e-30], dtype=dtype),
        ]
    )[:, None]
    n = torch.cat(
        [
            torch.arange(-2, 16, dtype=dtype),
            torch.tensor([30.0, 100.0, 129.0, 200.0, 513.0, 4.7, -0.5, float("nan")], dtype=dtype),
        ]
    )
    want, got = fn(x, n), _under_mode(fn, x, n)
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    rtol, atol = TOL[dtype]
    ok = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if dtype == torch.float32:  # the accuracy rule
        ref = fn(x.double(), n.double())
        err_native, err_got = (want.double() - ref).abs().nan_to_num(0.0), (got.double() - ref).abs()
        ok |= (err_got <= 2 * err_native + atol + rtol * ref.abs()) | (got.isnan() & want.isnan())
    assert ok.all(), (~ok).nonzero()[:5]


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_dtypes_and_scalars(name):
    fn = getattr(torch.special, name)
    xi, ni = torch.tensor([[1], [2], [-3]]), torch.tensor([0, 1, 3, 5])
    for args in ((xi, ni), (xi, 3), (0.25, ni), (xi.bool(), ni), (xi.float(), ni.double())):
        want, got = fn(*args), _under_mode(fn, *args)
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
        torch.testing.assert_close(got, want, equal_nan=True)


def test_polynomial_declines_huge_degree():
    # a recurrence past _MAX_STEPS steps (|x| > 1: no closed form) is declined, not run
    with pytest.raises(ed.UnsupportedOpError), ed.EagerDecompMode("core_aten"):
        torch.special.legendre_polynomial_p(torch.tensor([1.5]), torch.tensor([10**6]))
