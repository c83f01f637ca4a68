"""grid_sampler_2d_backward (eagerdecomp/grid_sample.py) against eager's kernel."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def _grid(g, shape, dtype):
    # inside, outside and far outside the [-1, 1] square (reflection folds several times)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * 2.5).to(dtype)


@pytest.mark.parametrize("interpolation", [0, 1], ids=["bilinear", "nearest"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_backward_matches_the_kernel(interpolation, padding, align_corners, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 7, generator=g, dtype=dtype)
    grid = _grid(g, (2, 4, 6, 2), dtype)
    up = torch.randn(2, 3, 4, 6, generator=g, dtype=dtype)
    for mask in ([True, True], [False, True]):
        want = aten.grid_sampler_2d_backward(up, x, grid, interpolation, padding, align_corners, mask)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = aten.grid_sampler_2d_backward(up, x, grid, interpolation, padding, align_corners, mask)
        rec.assert_only("core_aten")
        for w, o in zip(want, got):
            if w is None:
                assert o is None
                continue
            assert (o.dtype, o.shape, o.stride()) == (w.dtype, w.shape, w.stride())
            torch.testing.assert_close(o, w)


def test_grid_sample_trains_under_the_mode():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 1.1, 0.0]]] * 2, dtype=torch.float64, requires_grad=True)

    def step():
        grid = torch.nn.functional.affine_grid(theta, [2, 3, 6, 6], align_corners=False)
        y = torch.nn.functional.grid_sample(x, grid, padding_mode="border", align_corners=False)
        return torch.autograd.grad((y * y).sum(), [x, theta])

    want = step()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = step()
    rec.assert_only("core_aten")
    for w, o in zip(want, got):
        torch.testing.assert_close(o, w)


def test_bicubic_is_declined():
    x, grid = torch.randn(1, 1, 4, 4), torch.zeros(1, 2, 2, 2)
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError):
        aten.grid_sampler_2d_backward(torch.ones(1, 1, 2, 2), x, grid, 2, 0, False, [True, True])


@pytest.mark.parametrize("interpolation", [0, 1], ids=["trilinear", "nearest"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_3d_forward_and_backward_match_the_kernels(interpolation, padding, align_corners, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, 5, 6, generator=g, dtype=dtype)
    grid = _grid(g, (2, 3, 2, 4, 3), dtype)
    up = torch.randn(2, 3, 3, 2, 4, generator=g, dtype=dtype)
    want = aten.grid_sampler_3d(x, grid, interpolation, padding, align_corners)
    want_back = aten.grid_sampler_3d_backward(up, x, grid, interpolation, padding, align_corners, [True, True])
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = aten.grid_sampler_3d(x, grid, interpolation, padding, align_corners)
        got_back = aten.grid_sampler_3d_backward(up, x, grid, interpolation, padding, align_corners, [True, True])
    rec.assert_only("core_aten")
    for w, o in zip((want, *want_back), (got, *got_back)):
        assert (o.dtype, o.shape, o.stride()) == (w.dtype, w.shape, w.stride())
        torch.testing.assert_close(o, w)


_GS = torch.Generator().manual_seed(5)
GRID_2D_REFUSALS = {
    "5d-input": (torch.randn(1, 1, 2, 3, 3, generator=_GS), torch.randn(1, 2, 3, 3, 2, generator=_GS)),
    "5d-grid": (torch.randn(1, 1, 3, 3, generator=_GS), torch.randn(1, 3, 3, 2, 1, generator=_GS)),
    "3d-both": (torch.randn(1, 1, 3, generator=_GS), torch.randn(1, 3, 1, generator=_GS)),
    "batch": (torch.randn(2, 1, 3, 3, generator=_GS), torch.randn(1, 3, 3, 2, generator=_GS)),
    "empty-spatial": (torch.randn(1, 1, 0, 3, generator=_GS), torch.randn(1, 3, 3, 2, generator=_GS)),
}


@pytest.mark.parametrize("name", list(GRID_2D_REFUSALS))
def test_grid_sampler_2d_refusals_in_eagers_words_under_the_preset(name):
    # torch's decomposition (the preset's path) unpacked a 4-d input unchecked: ValueError on a
    # 5-d one, where eager raises RuntimeError (the device suites on edprims found it)
    from tests.compare import assert_raises_like_eager

    x, g = GRID_2D_REFUSALS[name]
    assert_raises_like_eager(torch.grid_sampler_2d, x, g, 0, 0, False, opset="prims_fusion", message=True)
