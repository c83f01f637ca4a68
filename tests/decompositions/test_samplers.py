"""poisson, binomial and _standard_gamma (eagerdecomp/samplers.py): the kernels' distributions and edge cases.

The numbers come from another order of the same stream, so values are compared by
distribution: a two-sample chi-square (counts) or Kolmogorov-Smirnov (gamma) test of ours
against native draws, with thresholds at about six standard deviations; seeds are fixed, so
each test is deterministic. Edge cases, where the kernels answer without drawing, match
exactly.
"""

import math

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

N = 60_000


def _ours(fn, *args):
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        out = fn(*args)
    rec.assert_only("core_aten")
    return out


def _chi_square(a, b):
    """Two-sample chi-square statistic over the values seen at least 10 times in all, and its dof."""
    values, counts = torch.cat([a, b]).unique(return_counts=True)
    keep = values[counts >= 10]
    stat, dof = 0.0, -1
    for v in keep.tolist():
        x, y = (a == v).sum().item(), (b == v).sum().item()
        stat += (x - y) ** 2 / (x + y)
        dof += 1
    rest_a, rest_b = (~torch.isin(a, keep)).sum().item(), (~torch.isin(b, keep)).sum().item()
    if rest_a + rest_b:
        stat += (rest_a - rest_b) ** 2 / (rest_a + rest_b)
        dof += 1
    return stat, max(dof, 1)


def _same_counts(native, ours):
    stat, dof = _chi_square(native.flatten(), ours.flatten())
    assert stat < dof + 6 * math.sqrt(2 * dof), (stat, dof)


def _same_continuous(native, ours):
    a, b = native.flatten().double().sort().values, ours.flatten().double().sort().values
    grid = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a, grid, right=True) / a.numel()
    cdf_b = torch.searchsorted(b, grid, right=True) / b.numel()
    d = (cdf_a - cdf_b).abs().max().item()
    assert d < 3.9 * math.sqrt(2 / a.numel()), d  # KS at p ~ 1e-6 (sqrt(-ln(5e-7) / 2) = 2.7; with margin)


@pytest.mark.parametrize("lam", [0.5, 3.0, 9.99, 10.0, 37.5, 1000.0])
def test_poisson_distribution(lam):
    torch.manual_seed(0)
    rate = torch.full((N,), lam)
    _same_counts(torch.poisson(rate), _ours(torch.poisson, rate))


@pytest.mark.parametrize(
    "count,prob", [(5, 0.3), (20, 0.45), (100, 0.3), (100, 0.8), (15, 0.9), (5.5, 0.5), (1e4, 0.01)]
)
def test_binomial_distribution(count, prob):
    torch.manual_seed(1)
    n, p = torch.full((N,), float(count)), torch.full((N,), prob)
    _same_counts(torch.binomial(n, p), _ours(torch.binomial, n, p))


@pytest.mark.parametrize("alpha", [0.3, 1.0, 4.5, 100.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_standard_gamma_distribution(alpha, dtype):
    torch.manual_seed(2)
    a = torch.full((N,), alpha, dtype=dtype)
    native, ours = torch._standard_gamma(a), _ours(torch._standard_gamma, a)
    assert ours.dtype == dtype and ours.shape == a.shape
    _same_continuous(native, ours)


def test_edge_cases_answer_as_the_kernels():
    # the answers the kernels give without drawing (or whatever they draw): exact
    lam = torch.tensor([0.0, 1e20, math.inf])
    torch.testing.assert_close(_ours(torch.poisson, lam), torch.poisson(lam))
    n = torch.tensor([0.0, -1.0, 5.0, 10.0, 3.0, 5.5, 7.0])
    p = torch.tensor([0.5, 0.5, 0.0, 1.0, math.nan, 1.5, -0.2])
    torch.testing.assert_close(_ours(torch.binomial, n, p), torch.binomial(n, p), equal_nan=True)
    a = torch.tensor([0.0, math.nan, math.inf, 1e-30])
    for dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(_ours(torch._standard_gamma, a.to(dtype)), torch._standard_gamma(a.to(dtype)))


def test_errors():
    for bad in (-1.0, math.nan):
        rate = torch.tensor([1.0, bad])
        with pytest.raises(RuntimeError) as native:
            torch.poisson(rate)
        with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError) as ours:
            torch.poisson(rate)
        assert str(ours.value) == str(native.value)
    with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError, match="NaN count"):
        torch.binomial(torch.tensor([math.nan]), torch.tensor([0.5]))  # the kernel would never return


@pytest.mark.parametrize(
    "fn,args",
    [
        (torch.poisson, (torch.full((4, 5), 12.0),)),
        (torch.binomial, (torch.full((4, 5), 30.0), torch.full((4, 5), 0.5))),
        (torch._standard_gamma, (torch.full((4, 5), 0.7),)),
    ],
)
def test_seeded_and_fresh(fn, args):
    def draw(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        return _ours(fn, *args)

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(), draw())
    assert draw().stride() == fn(*args).stride()


def test_on_the_reference_device(switched_device):
    torch.manual_seed(4)
    rate = torch.full((N,), 4.0)
    _same_counts(torch.poisson(rate), torch.poisson(rate.to(switched_device)).cpu())
    a = torch.full((N,), 2.5)
    _same_continuous(torch._standard_gamma(a), torch._standard_gamma(a.to(switched_device)).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_standard_gamma_grad_matches_the_kernel_on_every_branch(dtype):
    g = torch.Generator().manual_seed(5)
    alpha = torch.cat(
        [
            torch.rand(2000, generator=g) * 0.9 + 0.05,  # Taylor series (x < 0.8) mostly
            torch.rand(2000, generator=g) * 7 + 1,  # rational approximation
            torch.rand(2000, generator=g) * 50 + 8.5,
        ]
    ).to(dtype)  # Rice saddle point
    x = torch._standard_gamma(alpha)
    x[-1000:] = alpha[-1000:] * (0.85 + 0.3 * torch.rand(1000, generator=g)).to(dtype)  # near and at the mode
    want = torch._standard_gamma_grad(alpha, x)
    got = _ours(torch._standard_gamma_grad, alpha, x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-10 if dtype == torch.float64 else 1.3e-6, atol=0)


def test_gamma_rsample_backward_under_the_mode():
    alpha = torch.full((2000,), 2.5, dtype=torch.float64, requires_grad=True)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        x = torch.distributions.Gamma(alpha, torch.ones_like(alpha)).rsample()
        (grad,) = torch.autograd.grad(x.sum(), alpha)
    rec.assert_only("core_aten")
    torch.testing.assert_close(grad, torch._standard_gamma_grad(alpha.detach(), x.detach()), rtol=1e-10, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_dirichlet_distribution(dtype):
    torch.manual_seed(6)
    alpha = torch.tensor([0.4, 1.0, 3.5], dtype=dtype).expand(N, 3).contiguous()
    native, ours = torch._sample_dirichlet(alpha), _ours(torch._sample_dirichlet, alpha)
    assert ours.dtype == dtype and ours.shape == alpha.shape
    torch.testing.assert_close(ours.sum(-1), torch.ones(N, dtype=dtype))
    for j in range(3):  # each marginal is Beta(alpha_j, sum - alpha_j)
        _same_continuous(native[:, j], ours[:, j])
    lo, hi = torch.finfo(dtype).tiny, torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype))
    tiny = torch.tensor([[1e-3, 1e-3, 50.0]], dtype=dtype)  # shares that round to 0 and 1: the kernel's clamps
    got = _ours(torch._sample_dirichlet, tiny)
    assert got.min() >= lo and got.max() <= hi
