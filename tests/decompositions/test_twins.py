"""Private twins of public ops (eagerdecomp/twins.py) and foreach aliases: exactly eager."""

import math

import pytest
import torch

import eagerdecomp as ed
from tests.compare import check_against_eager

aten = torch.ops.aten


def _check(fn, *args, **kwargs):
    check_against_eager(fn, *args, **kwargs)  # exact: NaN, the sign of zero, every bit


def _data(dtype, n=37):
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g).to(dtype)
        x[:4] = torch.tensor([math.nan, -0.0, 0.0, -math.inf])
        return x
    return torch.randint(-5, 5, (n,), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_add_relu(dtype):
    x, y = _data(dtype), _data(dtype).flip(0)
    if dtype.is_floating_point:  # NaN: see the NOTE on _add_relu (eager's answer depends on the position)
        x, y = x.nan_to_num(), y.nan_to_num()
    for n in (3, 37):  # a short tail and the vectorized body
        _check(aten._add_relu.Tensor, x[:n], y[:n])
        _check(aten._add_relu.Tensor, x[:n], y[:n], alpha=2)
        _check(aten._add_relu.Scalar, x[:n], 1, 3)
        _check(aten._add_relu.Scalar, x[:n], -1)


def test_add_relu_keeps_nan_as_the_vectorized_kernel_and_declines_16_bit():
    x = torch.full((64,), math.nan)
    assert torch.isnan(torch._add_relu(x, torch.zeros(64))[:32]).all()  # eager's vectorized body
    with ed.EagerDecompMode("core_aten"):
        assert torch.isnan(torch._add_relu(x, torch.zeros(64))).all()
        with pytest.raises(ed.UnsupportedOpError):
            torch._add_relu(x.bfloat16(), x.bfloat16())


def test_private_reductions_stack_and_scans():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    _check(aten._aminmax.default, x)
    _check(aten._aminmax.dim, x, 1)
    _check(aten._aminmax.dim, x, 0, True)
    _check(aten._logcumsumexp.default, x, 1)
    _check(aten._stack.default, [x, x * 2], 1)
    _check(aten._neg_view_copy.default, x.t())
    _check(aten._reshape_alias_copy.default, x.t(), [3, 8], [1, 3])


def test_slow_conv3d_forward():
    g = torch.Generator().manual_seed(2)
    x, w, b = (
        torch.randn(2, 3, 5, 6, 7, generator=g),
        torch.randn(4, 3, 2, 3, 2, generator=g),
        torch.randn(4, generator=g),
    )
    # another convolution kernel: rounding may differ
    check_against_eager(aten.slow_conv3d_forward, x, w, [2, 3, 2], b, [1, 2, 1], [0, 1, 1], exact=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_foreach_maximum_and_minimum_with_scalars(dtype):
    tensors = [_data(dtype, 5), _data(dtype, 7)[1:]]
    for scalar in (0.5, 2, -math.inf, math.nan):
        _check(aten._foreach_maximum.Scalar, tensors, scalar)
        _check(aten._foreach_minimum.Scalar, tensors, scalar)
    _check(aten._foreach_maximum.ScalarList, tensors, [0.5, -1])
    _check(aten._foreach_minimum.ScalarList, tensors, [3, math.nan])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("stats", [True, False], ids=["running-stats", "no-stats"])
def test_native_batch_norm_in_training_is_the_legit_kernel(dtype, stats):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 5, 5, generator=g).to(dtype)
    w, b = torch.randn(3, generator=g).to(dtype), torch.randn(3, generator=g).to(dtype)
    mean, var = (torch.randn(3).to(dtype), torch.rand(3).to(dtype) + 0.5) if stats else (None, None)
    for inp in (x, x.to(memory_format=torch.channels_last)):
        for weight, bias in ((w, b), (None, None)):
            # exact: outputs (values, dtypes, strides) and the running statistics written in place
            _check(aten.native_batch_norm.default, inp, weight, bias, mean, var, True, 0.1, 1e-5)
    m, v = (mean.clone(), var.clone()) if stats else (None, None)
    with ed.testing.RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        aten.native_batch_norm.default(x, w, b, m, v, True, 0.1, 1e-5)
    legit = aten._native_batch_norm_legit.default if stats else aten._native_batch_norm_legit.no_stats
    assert dict(rec.ops) == {legit: 1}  # one kernel, not PyTorch's ~35 ops
    if stats:
        assert (m._version, v._version) == (0, 0)  # as eager: native_batch_norm's schema writes nothing


def test_native_batch_norm_in_evaluation_keeps_pytorchs_decomposition():
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    with ed.testing.RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        aten.native_batch_norm.default(x, None, None, mean, var, False, 0.1, 1e-5)
    assert aten._native_batch_norm_legit_no_training.default not in rec.ops
