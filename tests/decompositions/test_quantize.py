"""Fake quantization (eagerdecomp/quantize.py): bitwise eager, ties, range edges, NaN and the backward."""

import math

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode
from tests.compare import assert_like_eager

aten = torch.ops.aten


def _inputs(dtype, scale):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, generator=g) * 40 * scale
    ties = (torch.arange(-300, 300) + 0.5) * scale  # exactly between two grid points
    edges = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30])
    return torch.cat([x, ties, edges]).to(dtype)


def _same(want, got):
    assert_like_eager(want, got)  # bitwise: NaN, the sign of zero, every value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize(
    "scale,zero_point,qmin,qmax", [(0.1, 0, -128, 127), (0.0173, 37, 0, 255), (3.0, -5, -(2**31), 2**31 - 1)]
)
def test_cachemask_is_bitwise_eager(dtype, scale, zero_point, qmin, qmax):
    x = _inputs(dtype, scale)
    want = aten.fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, qmin, qmax)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = aten.fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, qmin, qmax)
    rec.assert_only("core_aten")
    _same(want, got)


@pytest.mark.parametrize("enabled", [0, 1])
def test_tensor_qparams_and_training_step(enabled):
    x = _inputs(torch.float32, 0.05).requires_grad_()
    args = (
        torch.tensor([0.05]),
        torch.tensor([3], dtype=torch.int32),
        torch.tensor([enabled], dtype=torch.uint8),
        0,
        255,
    )
    want = aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x.detach(), *args)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(x.detach(), *args)
        y = torch.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255)  # the public op, with its backward
        (grad,) = torch.autograd.grad(y.nan_to_num().sum(), x)
    rec.assert_only("core_aten")
    _same(want, got)
    y_native = torch.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255)
    (grad_native,) = torch.autograd.grad(y_native.nan_to_num().sum(), x)
    _same((y_native, grad_native), (y, grad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("zp_dtype", [torch.int32, torch.float32], ids=str)
def test_per_channel_is_bitwise_eager(dtype, zp_dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(3, 4, 50, generator=g) * 5, (torch.arange(-300, 300).view(3, 4, 50) + 0.5) * 0.25], 2)
    x[0, 0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    x = x.to(dtype)
    scale = torch.tensor([0.25, 0.1, 0.0173, 2.0])
    zero_point = torch.tensor([0, 3, 7, 100]).to(zp_dtype)
    if zp_dtype.is_floating_point:
        zero_point = zero_point + 0.3
    for qmin, qmax in ((-128, 127), (0, 255)):
        want = aten.fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, 1, qmin, qmax)
        if zp_dtype == torch.float32 and dtype == torch.float64:  # declined: see the NOTE on the per-channel fill
            with pytest.raises(ed.UnsupportedOpError) as info, ed.EagerDecompMode("core_aten"):
                aten.fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, 1, qmin, qmax)
            assert info.value.op is aten.fake_quantize_per_channel_affine_cachemask.default
            assert "aten.fake_quantize_per_channel_affine_cachemask.default has no path" in str(info.value)
            continue
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = aten.fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, 1, qmin, qmax)
        rec.assert_only("core_aten")
        _same(want, got)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 300, 0, 255),
        lambda x: aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, 10, 5),
        lambda x: aten.fake_quantize_per_channel_affine_cachemask(
            x, torch.tensor([0.1, 0.2]), torch.tensor([0, 1], dtype=torch.int32), 1, 5, 3
        ),
        lambda x: aten.fake_quantize_per_channel_affine_cachemask(
            x, torch.tensor([0.1, 0.2]), torch.tensor([0, 9], dtype=torch.int32), 1, 0, 3
        ),
        lambda x: aten.fake_quantize_per_channel_affine_cachemask(
            x, torch.tensor([0.1, 0.2]).double(), torch.tensor([0, 1], dtype=torch.int32), 1, 0, 3
        ),
        lambda x: aten.fake_quantize_per_channel_affine_cachemask(
            x, torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 1, 0, 3
        ),
    ],
)
def test_argument_errors_are_eagers(call):
    x = torch.randn(2, 2)
    with pytest.raises(RuntimeError) as native:
        call(x)
    with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError) as ours:
        call(x)
    assert str(ours.value) == str(native.value)
