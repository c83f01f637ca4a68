"""Resizing dtypes eager's CPU kernels refuse are refused with eager's own error and message, under
the mode and on edref with the switch (whose kernels are the CPU's); the dtypes they accept (uint8
bilinear and bicubic included) give the CPU's result (uint8 bit for bit).

NOTE: PyTorch's test_upsamplingBiMode2d_nonsupported_dtypes expects uint8 bilinear and bicubic
refused on every device but the CPU, because CUDA has no uint8 kernel for them; the reference
device resizes uint8 as the CPU does (tests/devsuites/known.py)."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed

CASES = [
    ((1, 3, 32, 32), "nearest", False),
    ((1, 3, 32, 32), "bilinear", False),
    ((1, 3, 32, 32), "bilinear", True),
    ((1, 5, 32, 32), "bicubic", False),
    ((1, 3, 32, 32), "bicubic", True),
    ((1, 3, 8), "linear", False),
    ((1, 3, 4, 4, 4), "trilinear", False),
]
DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32]


def _resize(x, mode, antialias):
    size = (12,) * (x.dim() - 2)
    return F.interpolate(x, size, mode=mode, antialias=antialias)


def _outcome(fn):
    try:
        return fn()
    except RuntimeError as e:  # (NotImplementedError is one)
        return e


def _assert_same_outcome(got, want):
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want)
    else:
        assert not isinstance(got, Exception), got
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
        if want.is_floating_point():  # a decomposition's float sums, in another order: to rounding
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
        else:  # uint8: the CPU's integer result, exactly
            assert torch.equal(got.cpu(), want)


# every case in its contiguous layout, and the 4-d ones channels-last too (CPU's kernels differ by layout)
LAYOUTS = [(*case, False) for case in CASES] + [(*case, True) for case in CASES if len(case[0]) == 4]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,mode,antialias,channels_last", LAYOUTS, ids=[f"{m}-aa{a}-{len(s) - 2}d-cl{c}" for s, m, a, c in LAYOUTS]
)
def test_resize_dtypes_under_the_mode(shape, mode, antialias, channels_last, dtype):
    x = torch.randint(0, 100, shape).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = _outcome(lambda: _resize(x, mode, antialias))
    with ed.EagerDecompMode("core_aten"):
        got = _outcome(lambda: _resize(x, mode, antialias))
    _assert_same_outcome(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,mode,antialias", CASES[:5], ids=[f"{m}-aa{a}" for s, m, a in CASES[:5]])
def test_resize_dtypes_on_the_device(switched_device, shape, mode, antialias, dtype):
    x = torch.randint(0, 100, shape).to(dtype)
    want = _outcome(lambda: _resize(x, mode, antialias))
    got = _outcome(lambda: _resize(x.to(switched_device), mode, antialias))
    _assert_same_outcome(got, want)
