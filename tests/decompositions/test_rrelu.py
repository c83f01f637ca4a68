"""rrelu_with_noise (eagerdecomp/rrelu.py): eager's own random numbers, noise and generator state."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def _input(shape, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    if x.numel():
        x.view(-1)[0] = float("nan")  # not <= 0: passes through with noise 1
        x.view(-1)[-1] = 0.0  # <= 0: drawn for
    return x


def _exact(want, got):
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(want.nan_to_num(), got.nan_to_num()) and torch.equal(want.isnan(), got.isnan())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("training", [True, False])
def test_rrelu_draws_eagers_numbers(dtype, training):
    for shape in [(), (5,), (4, 7), (3, 0)]:
        for lower, upper in [(0.125, 1 / 3), (0.1, 0.3), (0.5, 0.5)]:
            x = _input(shape, dtype)
            torch.manual_seed(7)
            want = F.rrelu(x, lower, upper, training=training)
            torch.manual_seed(7)
            with warnings.catch_warnings(), RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
                warnings.simplefilter("ignore")
                got = F.rrelu(x, lower, upper, training=training)
            rec.assert_only("core_aten")
            _exact(want, got)
            torch.manual_seed(7)
            F.rrelu(x, lower, upper, training=training)
            expected_state = torch.rand(3)
            torch.manual_seed(7)
            with ed.EagerDecompMode("core_aten"):
                F.rrelu(x, lower, upper, training=training)
            assert torch.equal(expected_state, torch.rand(3))  # the generator is left where eager leaves it


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_rrelu_with_noise_writes_noise_and_in_place(dtype):
    x = _input((6, 5), dtype)
    for op in (aten.rrelu_with_noise.default, aten.rrelu_with_noise_.default):
        a, b = x.clone(), x.clone()
        n1, n2 = torch.full_like(x, 9.0), torch.full_like(x, 9.0)
        torch.manual_seed(3)
        want = op(a, n1, 0.1, 0.4, True)
        torch.manual_seed(3)
        with ed.EagerDecompMode("core_aten"):
            got = op(b, n2, 0.1, 0.4, True)
        _exact(want, got)
        _exact(n1, n2)
        _exact(a, b)
        assert (got is b) == (want is a)


def test_rrelu_declines_what_it_cannot_reproduce():
    x = torch.randn(4, 4)
    with ed.EagerDecompMode("core_aten"):
        with pytest.raises(ed.UnsupportedOpError):  # eager writes noise through its data pointer
            aten.rrelu_with_noise(x, torch.empty(4, 4).t(), 0.1, 0.3, True)
        with pytest.raises(ed.UnsupportedOpError):  # core rand takes no generator
            aten.rrelu_with_noise(x, torch.empty(4, 4), 0.1, 0.3, True, torch.Generator())
        with pytest.raises(RuntimeError, match="noise tensor shape"):
            aten.rrelu_with_noise(x, torch.empty(3), 0.1, 0.3, True)
