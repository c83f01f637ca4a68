"""histc, histogram and histogramdd (eagerdecomp/histogram.py): eager's edges and bins, bit for bit."""

import math
import warnings

import pytest
import torch

import eagerdecomp as ed
from tests.compare import assert_raises_like_eager, check_against_eager


def _same(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - eager rejects the call: the mode must, with eager's error
            assert_raises_like_eager(fn, *args, **kwargs)
            return
        check_against_eager(fn, *args, **kwargs)


def _inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [
        torch.randn(shape, generator=g) * scale
        for shape, scale in [((), 3), ((5,), 5), ((5, 5), 5), ((17, 3), 100), ((40,), 1)]
    ]
    xs.append(torch.tensor([0.0, 1.0, 2.0, 3.0, math.nan, 10.0, -10.0, 2.5]))  # edges hit exactly, NaN skipped
    return [x.to(dtype) for x in xs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_histc(dtype):
    for x in _inputs(dtype, 0):
        for bins, lo, hi in [(100, 0, 0), (3, 0, 10), (10, -10, 10), (7, -3.3, 2.7), (1, -1, -1), (10, 0, 2)]:
            _same(torch.histc, x, bins=bins, min=lo, max=hi)


def test_histc_declines_large_16bit_inputs():
    # counts add in the 16-bit type (exact to 256) and per thread in eager: declined above 256 elements
    with pytest.raises(ed.UnsupportedOpError), ed.EagerDecompMode("core_aten"):
        torch.histc(torch.randn(300, dtype=torch.bfloat16), bins=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_histogram(dtype):
    g = torch.Generator().manual_seed(1)
    for x in _inputs(dtype, 1):
        w = torch.rand(x.shape, generator=g).to(dtype)
        for bins in (1, 4, 13):
            for rng in (None, (-2.0, 2.0), (0.0, 0.0)):
                for density in (False, True):
                    _same(torch.histogram, x, bins, range=rng, weight=w if density else None, density=density)
        unsorted = torch.randn(5, generator=g).to(dtype)  # eager's binary search decides, probe for probe
        for edges in (unsorted, unsorted.sort().values, torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=dtype)):
            _same(torch.histogram, x, edges, weight=w, density=False)
            _same(torch.histogram, x, edges, density=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_histogramdd(dtype):
    g = torch.Generator().manual_seed(2)
    for shape in [(5, 5), (4, 6, 2), (30, 3)]:
        x = (torch.randn(shape, generator=g) * 3).to(dtype)
        d = shape[-1]
        w = torch.rand(shape[:-1], generator=g).to(dtype)
        for density in (False, True):
            _same(torch.histogramdd, x, [2, 3, 1, 4, 2, 3][:d], weight=w, density=density)
            _same(torch.histogramdd, x, [3] * d, range=[-1.0, 1.0] * d, density=density)
            _same(
                torch.histogramdd,
                x,
                [torch.randn(4, generator=g).to(dtype) for _ in range(d)],
                weight=w,
                density=density,
            )


def test_eagers_errors():
    for message, fn, args, kwargs in (
        ("not finite", torch.histc, (torch.tensor([1.0, math.inf]),), dict(bins=3)),
        ("not finite", torch.histogram, (torch.tensor([1.0, math.nan]), 3), {}),
        ("max must be larger", torch.histc, (torch.tensor([1.0]),), dict(bins=3, min=2, max=1)),
    ):
        assert_raises_like_eager(fn, *args, message=message, **kwargs)
    with ed.EagerDecompMode("core_aten"):
        with pytest.raises(ed.UnsupportedOpError):  # no meta kernel: the traced out= is declined
            torch.histogram(torch.randn(5), torch.tensor([0.0, 1.0]), out=(torch.empty(0), torch.empty(0)))
