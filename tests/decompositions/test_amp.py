"""Mixed precision on a device with core ops only: autocast and GradScaler's kernels.

GradScaler's two kernels have no decomposition in PyTorch; eagerdecomp's (eagerdecomp/amp.py)
must be bitwise eager's, on every path a scaler takes (clean steps, inf/NaN steps, growth).
"""

import itertools

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode


def _unscale(grads, found, inv):
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return grads, found


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("nonfinite", [None, float("inf"), float("nan")])
def test_unscale_and_check_is_bitwise_eager(dtype, nonfinite):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, generator=g).mul(1000).to(dtype), torch.randn(3, 2, generator=g).to(dtype)]
    if nonfinite is not None:
        grads[1][1, 1] = nonfinite
    for was in (0.0, 1.0):
        inv = torch.tensor(3 / 65536.0)
        want = _unscale([x.clone() for x in grads], torch.tensor([was]), inv)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = _unscale([x.clone() for x in grads], torch.tensor([was]), inv)
        rec.assert_only("core_aten")
        for a, b in zip(want[0] + [want[1]], got[0] + [got[1]]):
            torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)  # dtype too


@pytest.mark.parametrize(
    "found,tracker,interval,scale", list(itertools.product((0.0, 1.0), (0, 1, 4), (2, 5), (65536.0, 3.3e38, 1.7)))
)
def test_update_scale_is_bitwise_eager(found, tracker, interval, scale):
    s, t, f = torch.tensor([scale]), torch.tensor([tracker], dtype=torch.int32), torch.tensor([found])
    s2, t2 = s.clone(), t.clone()
    torch._amp_update_scale_(s, t, f, 2.0, 0.3, interval)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        out = torch._amp_update_scale_(s2, t2, f, 2.0, 0.3, interval)
    rec.assert_only("core_aten")
    assert out is s2 and torch.equal(s2, s) and torch.equal(t2, t)


def _train(device, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    scaler = torch.amp.GradScaler(
        device.type if isinstance(device, torch.device) else device, init_scale=2.0**16, growth_interval=2
    )
    x, y = torch.randn(6, 8), torch.randn(6, 2)
    scales = []
    for i in range(steps):
        xi = x.clone()
        if i == 1:
            xi[0, 0] = float("inf")  # an overflowing step: skipped, scale backs off
        with torch.autocast(device.type if isinstance(device, torch.device) else device, dtype=torch.bfloat16):
            loss = (model(xi.to(device)).float() - y.to(device)).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


def test_gradscaler_training_on_the_device_matches_cpu(switched_device):
    want, want_scales = _train("cpu")
    got, got_scales = _train(switched_device)
    assert got_scales == want_scales and want_scales[1] < want_scales[0]
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
