"""median/nanmedian (dim), kthvalue and mode (eagerdecomp/selection.py): the CPU kernels' indices, ties included."""

import math

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.decompositions.selection import MODE_MAX_SIZE, _introselect_all_equal
from tests.compare import assert_like_eager, check_against_eager


def _check(fn, x, *args, **kwargs):
    check_against_eager(fn, x, *args, **kwargs)


def _rows(g, shape, dtype, nan=0.0, levels=4):
    """Values with many ties (few levels), some NaN: where the kernels' index rules matter."""
    x = torch.randint(0, levels, shape, generator=g).to(dtype)
    if nan and dtype.is_floating_point:
        x[torch.rand(shape, generator=g) < nan] = math.nan
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [torch.median, torch.nanmedian], ids=["median", "nanmedian"])
def test_median_dim_ties_and_nans(fn, dtype):
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 16, 33):
        for nan in (0.0, 0.3):
            x = _rows(g, (6, n, 3), dtype, nan)
            if dtype.is_floating_point:
                x[0, :, 0] = math.nan  # a whole row of NaN: nanmedian's introselect index
            for dim in (0, 1, -1):
                for keepdim in (False, True):
                    _check(fn, x, dim, keepdim)
            _check(fn, x.transpose(0, 2), 1)  # a non-contiguous input


def test_nanmedian_all_nan_index_is_the_kernels():
    lengths = range(1, 200)
    want = [torch.nanmedian(torch.full((n,), math.nan), 0).indices.item() for n in lengths]
    assert [_introselect_all_equal(n) for n in lengths] == want
    assert len(set(want)) > 10  # not a constant: the test can tell a wrong rule


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16], ids=str)
def test_mode_ties_nans_and_insertion_order(dtype):
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 3, 7, MODE_MAX_SIZE):
        for nan in (0.0, 0.25):
            x = _rows(g, (40, n), dtype, nan, levels=2 if dtype == torch.bool else 4)
            if dtype.is_floating_point:
                x[0, 0] = -1.0  # less than element 0 of its row? no: it is element 0; next row:
                if n > 2:
                    x[1, :] = torch.tensor([2.0, math.nan] + [1.0] * (n - 2)).to(dtype)  # jumps over the NaN
            for keepdim in (False, True):
                _check(torch.mode, x, 1, keepdim)
                _check(torch.mode, x.t(), 0, keepdim)


def test_mode_declines_rows_past_the_insertion_sort():
    x = torch.zeros(MODE_MAX_SIZE + 1)
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError, match="mode"):
        torch.mode(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16], ids=str)
def test_kthvalue_ties_follow_the_quickselect(dtype):
    g = torch.Generator().manual_seed(2)
    for n in (1, 2, 3, 4, 9, 40):
        for levels in (3, 1000):  # many ties; almost none (the core-op path alone)
            x = _rows(g, (5, n, 2), dtype, 0.2, levels)
            for k in sorted({1, (n + 1) // 2, n}):
                for keepdim in (False, True):
                    _check(torch.kthvalue, x, k, 1, keepdim)


def test_kthvalue_without_ties_matches_and_scalars():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    _check(torch.kthvalue, x, 17, 1)
    _check(torch.kthvalue, torch.tensor(2.5), 1)
    _check(torch.median, torch.tensor(2.5), 0)
    _check(torch.mode, torch.tensor(2.5))


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.kthvalue(torch.zeros(3, 2), 3, 1),
        lambda: torch.kthvalue(torch.zeros(3, 0), 1, 1),
        lambda: torch.median(torch.zeros(3, 0), 1),
        lambda: torch.mode(torch.zeros(3, 0), 1),
    ],
)
def test_errors_are_eagers(call):
    with pytest.raises(Exception) as native:
        call()
    with ed.EagerDecompMode("core_aten"), pytest.raises(type(native.value)) as ours:
        call()
    assert str(ours.value) == str(native.value)


def test_on_the_reference_device(switched_device):
    g = torch.Generator().manual_seed(4)
    x = _rows(g, (8, 9), torch.float32, 0.2)
    y = x.to(switched_device)
    for fn, args in ((torch.median, (1,)), (torch.nanmedian, (0,)), (torch.mode, (1,)), (torch.kthvalue, (3, 1))):
        want, got = fn(x, *args), fn(y, *args)
        assert_like_eager(list(want), [t.cpu() for t in got])
