"""Distribution checks for random ops whose numbers come from another stream than eager's.

A random op under the mode may draw from the same seeded stream in another order (integer
draws, bernoulli, dropout, the samplers): its values then differ from eager's, and only its
*distribution* can be compared. Two checks, each with a false-alarm rate bounded without any
assumption on the distribution (heavy tails, atoms, dependence inside a draw included):

* :func:`same_distribution`, ours against eager's own draws. Each side is ``k`` independent
  *units* (calls, or rows of one call that share no draw), ``m`` values each. Per unit it
  computes a few statistics: the mean, the second moment about the pooled mean, the fraction of
  values at or below each of a grid of pooled quantiles (the empirical CDF: the goodness of fit)
  and the fractions of NaN and infinities. For each statistic ``d_c = eager_c - ours_c`` over
  units ``c``; with ours drawn independently of eager's (another seed), each ``d_c`` is symmetric
  about 0 when the distributions agree, so ``T = sum d_c / sqrt(sum d_c**2)`` is a
  sign-flip (Rademacher) sum and ``P(|T| >= x) <= 2 exp(-x**2 / 2)`` (Hoeffding, conditionally on
  the ``|d_c|``; the grid is a function of the pooled values, so it does not depend on the
  signs). Thresholds are Bonferroni-corrected over the statistics: the whole check raises a
  false alarm with probability at most ``alpha``.
* :func:`matches_cdf`, one sample against a known CDF: the Kolmogorov-Smirnov distance of
  ``n`` independent values, held to the Dvoretzky-Kiefer-Wolfowitz-Massart bound
  ``P(D > eps) <= 2 exp(-2 n eps**2)`` (valid for any distribution, lattice ones included).

:func:`moments_match` adds a CLT check of the mean and variance against the known ones (an
approximate rate: the normal approximation of the sample moments).

Each returns ``None`` when the check passes, else a message naming the statistic, eager's and
our value; the tests draw at fixed seeds, so each check is deterministic anyway.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ALPHA", "as_units", "same_distribution", "matches_cdf", "moments_match", "values_of"]

# false-alarm rate of one whole check (all its statistics together)
ALPHA = 1e-6
GRID = 31  # pooled quantiles at which the empirical CDFs are compared
DISCRETE = 64  # at most this many distinct values: the CDF is compared at every one of them


def values_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as float64 (complex as its real and imaginary parts, bool as 0/1)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.detach().to("cpu", torch.float64)


def as_units(t: torch.Tensor, units: int) -> torch.Tensor:
    """``t`` as ``[units, m]`` float64: rows of consecutive elements (they must not share draws
    across rows: for dropout2d a row holds whole channels)."""
    v = values_of(t).reshape(-1)
    if v.numel() % units:
        raise ValueError(f"{v.numel()} values do not split into {units} units")
    return v.reshape(units, -1)


def _signflip_threshold(alpha: float, statistics: int) -> float:
    return math.sqrt(2 * math.log(2 * statistics / alpha))


def _unit_statistics(x: torch.Tensor, grid: torch.Tensor, center: float, nonfinite: bool) -> dict:
    finite = torch.isfinite(x)
    count = finite.sum(1).clamp(min=1).to(torch.float64)
    safe = torch.where(finite, x, 0.0)
    stats = {
        "mean": safe.sum(1) / count,
        "second moment": torch.where(finite, (x - center) ** 2, 0.0).sum(1) / count,
    }
    # NaN is never <= a (finite) grid point: sorted as +inf
    ordered = torch.where(torch.isnan(x), math.inf, x).sort(1).values
    below = torch.searchsorted(ordered, grid.expand(x.shape[0], -1).contiguous(), right=True) / x.shape[1]
    for j, t in enumerate(grid.tolist()):
        stats[f"P(x <= {t:.6g})"] = below[:, j].to(torch.float64)
    if nonfinite:
        stats["P(NaN)"] = torch.isnan(x).to(torch.float64).mean(1)
        stats["P(+inf)"] = (x == math.inf).to(torch.float64).mean(1)
        stats["P(-inf)"] = (x == -math.inf).to(torch.float64).mean(1)
    return stats


def same_distribution(eager: torch.Tensor, ours: torch.Tensor, alpha: float = ALPHA) -> str | None:
    """Whether ``ours`` (``[k, m]``) is drawn from the distribution of ``eager`` (``[k, m]``):
    ``None``, or a message naming the statistics that differ. ``eager`` and ``ours`` must come
    from independent draws (another seed); their rows are the independent units."""
    eager, ours = values_of(eager), values_of(ours)
    if eager.shape != ours.shape or eager.dim() != 2:
        raise ValueError(f"expected two [units, m] tensors of one shape, got {eager.shape} and {ours.shape}")
    if eager.numel() == 0:
        return None
    pooled = torch.cat([eager.reshape(-1), ours.reshape(-1)])
    finite = pooled[torch.isfinite(pooled)]
    nonfinite = finite.numel() < pooled.numel()
    if finite.numel() == 0:
        grid, center = torch.zeros(0, dtype=torch.float64), 0.0
    else:
        distinct = finite.unique()
        if distinct.numel() <= DISCRETE:
            grid = distinct[:-1]  # P(x <= max) is 1 on both sides
        else:
            levels = torch.arange(1, GRID + 1, dtype=torch.float64) / (GRID + 1)
            grid = torch.quantile(finite[:: max(1, finite.numel() // 1_000_000)], levels).unique()
        center = finite.mean().item()
    a = _unit_statistics(eager, grid, center, nonfinite)
    b = _unit_statistics(ours, grid, center, nonfinite)
    bound = _signflip_threshold(alpha, len(a))
    failures = []
    for name in a:
        d = a[name] - b[name]
        norm = d.square().sum().sqrt().item()
        if norm == 0 or not math.isfinite(norm):
            # identical per-unit statistics (no evidence), or moments that overflow: the
            # CDF statistics still compare such values
            continue
        t = d.sum().item() / norm
        if abs(t) > bound:
            failures.append((abs(t), f"{name}: eager {a[name].mean().item():.6g}, ours {b[name].mean().item():.6g}"))
    if not failures:
        return None
    failures.sort(reverse=True)
    units, m = eager.shape
    head = f"not eager's distribution ({units} units of {m} values; sign-flip |T| > {bound:.2f}, alpha {alpha:g})"
    return head + ": " + "; ".join(msg + f" (|T| {t:.1f})" for t, msg in failures[:4])


def _dkw_epsilon(n: int, alpha: float) -> float:
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def matches_cdf(values: torch.Tensor, cdf, lattice: bool = False, alpha: float = ALPHA) -> str | None:
    """Whether independent ``values`` follow the distribution whose CDF is ``cdf`` (a function of
    a float64 tensor): the Kolmogorov-Smirnov distance within the DKW-Massart bound at ``alpha``.
    ``lattice``: a distribution on the integers (the CDF is then also read just below each value,
    at ``value - 1``); otherwise a continuous one."""
    x = values_of(values).reshape(-1)
    n = x.numel()
    if n == 0:
        return None
    if torch.isnan(x).any():
        return f"{int(torch.isnan(x).sum())} NaN values"
    distinct, counts = x.unique(return_counts=True)  # sorted
    at = torch.cumsum(counts, 0).to(torch.float64) / n  # empirical CDF at each distinct value
    before = at - counts.to(torch.float64) / n  # ... just below it
    f_at = cdf(distinct)
    f_before = cdf(distinct - 1) if lattice else f_at
    d = torch.maximum((at - f_at).abs().max(), (before - f_before).abs().max()).item()
    eps = _dkw_epsilon(n, alpha)
    if d > eps:
        worst = int(torch.argmax(torch.maximum((at - f_at).abs(), (before - f_before).abs())))
        return (
            f"Kolmogorov-Smirnov distance {d:.4f} > {eps:.4f} (n {n}, alpha {alpha:g}): "
            f"at {distinct[worst].item():.6g} the sample's CDF is {at[worst].item():.4f}, "
            f"the distribution's {f_at[worst].item():.4f}"
        )
    return None


def moments_match(values: torch.Tensor, mean: float, var: float, z: float = 5.3) -> str | None:
    """The sample mean and variance of independent ``values`` within ``z`` standard errors of
    ``mean`` and ``var`` (the errors from the known variance and the sample's fourth moment).
    ``z = 5.3``: a two-sided rate of about 1e-7 each under the normal approximation."""
    x = values_of(values).reshape(-1)
    n = x.numel()
    m = x.mean().item()
    c = x - m
    s2 = c.square().mean().item()
    m4 = c.pow(4).mean().item()
    problems = []
    if abs(m - mean) > z * math.sqrt(var / n):
        problems.append(f"mean {m:.6g}, expected {mean:.6g} (+- {z * math.sqrt(var / n):.2g})")
    tol = z * math.sqrt(max(m4 - s2 * s2, 0.0) / n) + 1e-12
    if abs(s2 - var) > tol:
        problems.append(f"variance {s2:.6g}, expected {var:.6g} (+- {tol:.2g})")
    return "; ".join(problems) or None
