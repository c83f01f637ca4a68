"""Fractional max pooling (eagerdecomp/fractional.py): the kernels' windows, ties, NaN, layouts and gradients."""

import math

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode
from tests.compare import check_against_eager

aten = torch.ops.aten


def _run(op, x, *args):
    check_against_eager(op, x, *args)


def _input(shape, dtype, g):
    x = torch.randint(0, 4, shape, generator=g).to(dtype)  # many ties
    flat = x.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:5]] = math.nan
    flat[torch.randperm(flat.numel(), generator=g)[:5]] = -math.inf
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_fractional_max_pool2d(dtype):
    g = torch.Generator().manual_seed(0)
    for shape, k, out in (
        ((2, 3, 11, 9), (2, 3), (5, 4)),
        ((3, 10, 10), (3, 3), (1, 7)),
        ((1, 2, 7, 7), (1, 1), (7, 7)),
    ):
        x = _input(shape, dtype, g)
        samples = torch.rand(x.shape[0] if x.dim() == 4 else 1, shape[-3], 2, generator=g).to(dtype)
        _run(aten.fractional_max_pool2d, x, list(k), list(out), samples)
        if x.dim() == 4:
            _run(aten.fractional_max_pool2d, x.to(memory_format=torch.channels_last), list(k), list(out), samples)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_fractional_max_pool3d(dtype):
    g = torch.Generator().manual_seed(1)
    for shape, k, out in (((2, 2, 6, 7, 8), (2, 2, 3), (3, 4, 5)), ((2, 5, 5, 5), (2, 1, 2), (2, 4, 1))):
        x = _input(shape, dtype, g)
        samples = torch.rand(x.shape[0] if x.dim() == 5 else 1, shape[-4], 3, generator=g).to(dtype)
        _run(aten.fractional_max_pool3d, x, list(k), list(out), samples)


def test_the_modules_train_as_native():
    g = torch.Generator().manual_seed(2)
    for pool, shape in (
        (torch.nn.FractionalMaxPool2d(3, output_ratio=0.5), (2, 3, 12, 10)),
        (torch.nn.FractionalMaxPool3d(2, output_size=(3, 4, 3)), (2, 2, 7, 8, 6)),
    ):
        x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
        torch.manual_seed(3)
        y = pool(x)
        (want,) = torch.autograd.grad(y.sum() * 2, x)
        torch.manual_seed(3)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            y2 = pool(x)
            (got,) = torch.autograd.grad(y2.sum() * 2, x)
        rec.assert_only("core_aten")
        assert torch.equal(y, y2) and torch.equal(want, got)
