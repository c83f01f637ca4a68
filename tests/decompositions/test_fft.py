"""The complex FFT from core r2c (eagerdecomp/fft.py): any length, both directions, every norm."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten
TOL = {torch.complex64: dict(rtol=1.3e-6, atol=1e-5), torch.complex128: dict(rtol=1e-7, atol=1e-7)}
TOL.update({torch.float32: TOL[torch.complex64], torch.float64: TOL[torch.complex128]})


def _close(want, got):
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want, **TOL[want.dtype])


def _under_mode(fn, *args):
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        out = fn(*args)
    rec.assert_only("core_aten")
    return out


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("norm", [0, 1, 2])
def test_c2c_matches_native(dtype, forward, norm):
    g = torch.Generator().manual_seed(0)
    for shape, dims in (
        ((1,), [0]),
        ((7,), [0]),
        ((4, 13), [1]),
        ((6, 5, 3), [0, 2]),
        ((2, 3, 4), [0, 1, 2]),
        ((257,), [0]),
    ):
        x = torch.randn(shape, dtype=dtype, generator=g)
        for inp in (x, x.transpose(0, -1)):  # strides decide the output layout
            _close(aten._fft_c2c(inp, dims, norm, forward), _under_mode(aten._fft_c2c, inp, dims, norm, forward))


def test_public_transforms_on_real_and_complex_input():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, 7, generator=g)
    z = torch.randn(5, 6, 7, dtype=torch.complex64, generator=g)
    calls = [
        (torch.fft.fft2, x),
        (torch.fft.fftn, x),
        (torch.fft.rfftn, x),
        (torch.fft.irfftn, z),
        (torch.fft.fft, z),
        (torch.fft.ifft, z),
        (torch.fft.fftn, z),
        (lambda t: torch.fft.ifftn(t, norm="ortho"), z),
        (lambda t: torch.fft.fft2(t, s=(3, 9)), x),
        (lambda t: torch.fft.ifft2(t, norm="forward"), z),
    ]
    for fn, inp in calls:
        _close(fn(inp), _under_mode(fn, inp))


def test_accuracy_against_float64_at_a_long_prime_length():
    # no worse than a native float32 FFT, judged against complex128 (the accuracy rule)
    x = torch.randn(3, 1009, dtype=torch.complex128, generator=torch.Generator().manual_seed(2))
    ref = torch.fft.fft(x)
    native = torch.fft.fft(x.to(torch.complex64))
    ours = _under_mode(torch.fft.fft, x.to(torch.complex64))
    err_native = (native.to(torch.complex128) - ref).abs().max()
    err_ours = (ours.to(torch.complex128) - ref).abs().max()
    assert err_ours <= 2 * err_native + 1e-5


def test_round_trip_and_empty_dims():
    z = torch.randn(4, 6, dtype=torch.complex128)
    back = _under_mode(lambda t: torch.fft.ifftn(torch.fft.fftn(t)), z)
    torch.testing.assert_close(back, z)
    _close(aten._fft_c2c(z, [], 1, True), _under_mode(aten._fft_c2c, z, [], 1, True))


def test_on_the_reference_device(switched_device):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    for fn in (torch.fft.fft2, torch.fft.fftn, lambda t: torch.fft.ifft2(torch.fft.rfft2(t))):
        want, got = fn(x), fn(x.to(switched_device))
        _close(want, got.cpu())
