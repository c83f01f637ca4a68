"""segment_reduce and _segment_reduce_backward (eagerdecomp/segments.py): eager's kernels, bitwise."""

import math
import warnings

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def _exact(want, got):
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert torch.equal(want.nan_to_num(), got.nan_to_num()) and torch.equal(want.isnan(), got.isnan())


def _both(data, reduce, **kwargs):
    x = data.detach().clone().requires_grad_(True)
    y = data.detach().clone().requires_grad_(True)
    want = aten.segment_reduce(x, reduce, **kwargs)
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(data.dtype)
    want.backward(grad)
    with warnings.catch_warnings(), RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        warnings.simplefilter("ignore")
        got = aten.segment_reduce(y, reduce, **kwargs)
        got.backward(grad)
    rec.assert_only("core_aten")
    _exact(want.detach(), got.detach())
    _exact(x.grad, y.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce(dtype, reduce):
    g = torch.Generator().manual_seed(0)
    data = torch.randn(7, 4, generator=g).to(dtype)
    data[2, 1] = math.nan  # sticks in max/min, goes through prod's explicit product
    data[3, 2] = 0.0
    data[5] = data[4]  # ties: max/min's gradient shared (positive parts only, as the kernel)
    lengths = torch.tensor([2, 0, 3, 2])
    for initial in (None, 0.5):
        _both(data, reduce, lengths=lengths, axis=0, unsafe=False, initial=initial)
        _both(data, reduce, offsets=torch.tensor([0, 2, 2, 5, 7]), axis=0, unsafe=False, initial=initial)
        _both(
            data, reduce, offsets=torch.tensor([0, 1, 4, 4, 6]), axis=0, unsafe=True, initial=initial
        )  # last row unused
    lengths2 = torch.tensor([[1, 3, 0], [2, 2, 0], [0, 0, 4]])
    _both(torch.randn(3, 4, 2, generator=g).to(dtype), reduce, lengths=lengths2, axis=1, unsafe=False, initial=1.0)


def test_segment_reduce_errors_and_declines():
    data = torch.randn(5)
    with ed.EagerDecompMode("core_aten"):
        with pytest.raises(RuntimeError):
            aten.segment_reduce(data, "sum", lengths=torch.tensor([2, -1, 4]), axis=0)
        with pytest.raises(RuntimeError):
            aten.segment_reduce(data, "sum", lengths=torch.tensor([2, 2]), axis=0)
        with pytest.raises(ed.UnsupportedOpError):  # would read outside the data in the kernel
            aten.segment_reduce(data, "sum", lengths=torch.tensor([4, 4]), axis=0, unsafe=True)
