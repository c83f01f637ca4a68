"""Antialiased resizing (eagerdecomp/antialias.py) against eager's kernels."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

SIZES = [((9, 13), (4, 5)), ((8, 8), (3, 8)), ((5, 7), (11, 13)), ((20, 17), (7, 3)), ((6, 6), (1, 1))]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("align_corners", [False, True])
def test_forward_and_backward(mode, dtype, align_corners):
    g = torch.Generator().manual_seed(0)
    for (ih, iw), size in SIZES:
        x = torch.randn(2, 3, ih, iw, generator=g, dtype=dtype, requires_grad=True)
        up = torch.randn(2, 3, *size, generator=g, dtype=dtype)

        def run():
            y = F.interpolate(x, size=size, mode=mode, antialias=True, align_corners=align_corners)
            return y, torch.autograd.grad(y, x, up)[0]

        want = run()
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = run()
        rec.assert_only("core_aten")
        for w, o in zip(want, got):
            assert (o.dtype, o.shape, o.stride()) == (w.dtype, w.shape, w.stride())
            torch.testing.assert_close(o, w)


def test_scale_factor_and_torchvision_style_downscale():
    x = torch.rand(1, 3, 64, 48, generator=torch.Generator().manual_seed(1))
    for kwargs in (dict(scale_factor=0.3), dict(size=(17, 29)), dict(scale_factor=(0.5, 0.25))):
        want = F.interpolate(x, mode="bilinear", antialias=True, **kwargs)
        with ed.EagerDecompMode("core_aten"):
            got = F.interpolate(x, mode="bilinear", antialias=True, **kwargs)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
