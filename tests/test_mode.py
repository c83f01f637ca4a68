"""EagerDecompMode end to end, with an independent RecordingMode entered outside it."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def programs():
    # NOTE: no matmul here: prims has no matmul or convolution, so such programs are
    # unsupported under "prims" (tested in test_errors.py)
    x = torch.randn(6, 8)
    w = torch.randn(8, 8)
    return {
        "silu": lambda: F.silu(x),
        "addcmul": lambda: torch.addcmul(x, x, x.flip(0), value=0.25),
        "inplace": lambda: x.clone().mul_(2.0).add_(1),
        "out": lambda: torch.add(x, x, out=torch.empty(6, 8)),
        "view": lambda: x.t().narrow(0, 1, 3),
        "log_softmax": lambda: F.log_softmax(x, -1),
        "gelu": lambda: F.gelu(x * w[0]),
        "losses": lambda: F.mse_loss(x, x.flip(1)) + F.smooth_l1_loss(x, x.flip(0)),
    }


@pytest.mark.parametrize("name", sorted(programs()))
@pytest.mark.parametrize("opset", ["core_aten", "prims"])
def test_only_opset_ops_reach_the_kernels(name, opset):
    fn = programs()[name]
    expected = fn()
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = fn()
    rec.assert_only(opset)
    torch.testing.assert_close(got, expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype and got.stride() == expected.stride()


def test_custom_small_opset():
    # silu must land on exactly these: sigmoid is decomposed too, through its own decomposition
    small = ed.OpSet.preset("core_aten") - ["aten::sigmoid"]
    x = torch.randn(16)
    with RecordingMode() as rec, ed.EagerDecompMode(small):
        y = F.silu(x)
    rec.assert_only(small)
    assert aten.sigmoid.default not in rec.ops
    torch.testing.assert_close(y, F.silu(x))


def test_opset_ops_pass_straight_through():
    x = torch.randn(4)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as m:
        y = torch.ops.aten.mul.Tensor(x, x)
    assert rec.ops == {aten.mul.Tensor: 1}
    assert torch.equal(y, x * x)
    assert m.report().row(aten.mul.Tensor).route == "passthrough"


def test_never_lowers_past_the_highest_supported_op():
    # silu is CompositeExplicit with a decomposition; with silu in the opset it must stay silu
    opset = ed.OpSet.preset("core_aten") | ["aten::silu"]
    x = torch.randn(5)
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        F.silu(x)
    assert rec.ops[aten.silu.default] == 1 and aten.sigmoid.default not in rec.ops


def test_replay_returns_same_object_for_inplace_and_views_for_view_ops():
    x = torch.randn(3, 4)
    with ed.EagerDecompMode("core_aten"):
        for _ in range(2):  # trace, then replay
            y = x.clone()
            assert y.add_(1.0) is y
            t = x.t()
            assert t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert t.stride() == (1, 4)
            t[0, 0] = 42.0
            assert x[0, 0] == 42.0


def test_out_variant_lands_in_given_tensor():
    x = torch.randn(3)
    out = torch.empty(3)
    with ed.EagerDecompMode("core_aten"):
        for _ in range(2):
            r = torch.addcmul(x, x, x, out=out)
            assert r is out
    torch.testing.assert_close(out, torch.addcmul(x, x, x))


def test_out_resize_warns_on_every_call_like_eager():
    x = torch.randn(3)
    with ed.EagerDecompMode("core_aten"):
        for _ in range(2):
            out = torch.empty(5)
            with pytest.warns(UserWarning, match="resized"):
                torch.addcmul(x, x, x, out=out)
            assert out.shape == (3,)


def test_random_ops_draw_fresh_numbers_and_follow_manual_seed():
    x = torch.ones(1000)
    with ed.EagerDecompMode("core_aten") as m:
        a = F.dropout(x, 0.5, training=True)
        b = F.dropout(x, 0.5, training=True)  # replayed: must not repeat the traced sample
        torch.manual_seed(7)
        c = F.dropout(x, 0.5, training=True)
        torch.manual_seed(7)
        d = F.dropout(x, 0.5, training=True)
    assert not torch.equal(a, b)
    assert torch.equal(c, d)
    assert 0.4 < (a == 0).float().mean() < 0.6
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    rows = {r.op: r for r in m.report().rows}
    assert any(r.random for r in rows.values())


def test_data_dependent_ops_bypass_and_stay_below_the_mode():
    x = torch.tensor([0.0, 1.5, 0.0, -2.0])
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as m:
        got = torch.masked_select(x, x != 0)
    assert torch.equal(got, torch.tensor([1.5, -2.0]))
    rec.assert_only("core_aten")
    assert m.report().row(aten.masked_select.default).route == "bypassed"


def test_nested_backward_ops_are_decomposed():
    x = torch.randn(4, 5, requires_grad=True)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as m:
        F.silu(x).sum().backward()
    rec.assert_only("core_aten")
    assert m.report().row(aten.silu_backward.default).route == "decomposed"
    expected = torch.autograd.grad(F.silu(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_report_text_lists_routes():
    with ed.EagerDecompMode("core_aten") as m:
        F.silu(torch.randn(3)) * 2
    text = str(m.report())
    assert "aten.silu.default" in text and "decomposed" in text and "passthrough" in text


def test_the_modes_decompositions_are_used_over_every_registered_one():
    # hardswish through maximum/minimum: ops neither torch's nor the registered decomposition
    # calls, so the witness tells whose decomposition ran; the value is eager's either way
    from eagerdecomp.decompositions.registry import USER

    ran = []

    def by_the_mode(x):
        ran.append("mode")
        return x * torch.minimum(torch.maximum(x + 3, torch.zeros_like(x)), torch.full_like(x, 6.0)) / 6

    def registered(x):
        ran.append("registered")
        return x * torch.clamp(x + 3, 0, 6) / 6

    x = torch.linspace(-5, 5, 41)
    want = F.hardswish(x)
    try:
        ed.register_decomposition(aten.hardswish.default, override=True)(registered)
        mode = ed.EagerDecompMode("core_aten", decompositions={aten.hardswish.default: by_the_mode})
        with RecordingMode() as rec, mode:
            got = F.hardswish(x)
    finally:
        USER.pop(aten.hardswish.default, None)
        # a registration elsewhere moves the table's version on: no later runtime reuses kernels
        # traced while this one was registered
        ed.register_decomposition(aten.hardswish.default, _registry={})(registered)
    rec.assert_only("core_aten")
    assert ran == ["mode"], ran
    assert {aten.maximum.default, aten.minimum.default} <= set(rec.ops)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
