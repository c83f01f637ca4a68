"""The device switch on the strict reference device edref (eagerdecomp.device).

edref has kernels for core ATen + runtime ops only, each running the CPU kernel on
the same memory, so every result is compared with the same call on CPU. The device's
own op log (``op_log``) witnesses what ran on it.
"""

import copy
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.demo import SmallCNN, TransformerBlock, _max_param_diff, train_step
from eagerdecomp.errors import BackendError, UnsupportedOpError

refdev = pytest.importorskip("eagerdecomp.device.refdev")

try:
    DEV = refdev.reference_device()
except BackendError as e:  # no compiler here: the rest of the suite still runs
    pytest.skip(f"reference device unavailable: {e}", allow_module_level=True)

DEVICE_OPS = refdev.device_ops()
DEVICE_OP_NAMES = {n.removeprefix("aten::") for n in DEVICE_OPS.names()}


@pytest.fixture
def enabled():
    device_switch.disable(DEV)
    b = device_switch.enable(DEV)
    yield b
    device_switch.disable(DEV)


@pytest.fixture
def disabled():
    device_switch.disable(DEV)
    yield


def assert_same(cpu, dev):
    """Same values, dtype, shape, strides and storage offset as the CPU result."""
    assert dev.device.type == DEV.type
    assert (dev.dtype, dev.shape, dev.stride(), dev.storage_offset()) == (
        cpu.dtype,
        cpu.shape,
        cpu.stride(),
        cpu.storage_offset(),
    )
    torch.testing.assert_close(dev.cpu(), cpu, rtol=1e-6, atol=1e-6, equal_nan=True)


def same_storage(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# -- strictness --------------------------------------------------------------------------


def test_device_is_strict_without_eagerdecomp(disabled):
    x = torch.randn(4, 4, device=DEV)
    with pytest.raises(
        NotImplementedError, match=r"Could not run 'aten::silu\.out' with arguments from the 'edref' backend"
    ):
        F.silu(x)
    # a core op runs, on the device's own kernel
    with refdev.op_log() as ran:
        torch.testing.assert_close(torch.sigmoid(x).cpu(), torch.sigmoid(x.cpu()))
    assert ran["sigmoid"] == 1


def test_device_rejects_cpu_operands_like_a_real_device(enabled):
    d = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*CPU tensor of shape \[3\]"):
        torch.ops.aten.add.Tensor(d, torch.ones(3))
    assert_same(torch.ones(3) + torch.tensor(2.0), d + torch.tensor(2.0))  # a 0-dim CPU tensor may join
    assert_same(torch.ones(3).index_select(0, torch.tensor([0, 2])), d[torch.tensor([0, 2])])  # CPU indices too


def test_decomposed_index_ops_take_cpu_indices_like_eager(enabled):
    # SAM's relative positions index device tensors with CPU aranges: eager allows CPU indices
    # on any device, so a decomposed index_put_ must too (found by `make zoo DEVICE=edref`)
    idx = torch.tensor([0, 2, 2])
    cpu, dev = torch.zeros(6, 4), torch.zeros(6, 4, device=DEV)
    out = dev.index_put_((idx,), torch.ones(3, 4, device=DEV), accumulate=True)
    assert out is dev
    assert_same(cpu.index_put_((idx,), torch.ones(3, 4), accumulate=True), dev)
    # a CPU tensor that is not an index is still refused, as a device refuses it
    with pytest.raises(ed.DeviceMismatchError, match="index_put_"):
        dev.index_put_((idx.to(DEV),), torch.ones(3, 4), accumulate=True)


def test_demo_model_fails_without_eagerdecomp(disabled):
    model = TransformerBlock(dropout=0.0).to(DEV)
    x, y = TransformerBlock.batch(device=DEV)
    with pytest.raises(NotImplementedError, match=r"Could not run 'aten::\S+' with arguments from the 'edref' backend"):
        F.cross_entropy(model(x), y).backward()


def test_device_has_kernels_for_exactly_its_opset(disabled):
    # (torch itself registers c10d:: collectives for PrivateUse1)
    assert ed.OpSet(op for op in device_switch.device_opset(DEV) if op.namespace == "aten") == DEVICE_OPS
    core = ed.OpSet.preset("core_aten")
    assert torch.ops.aten.silu.default not in DEVICE_OPS and torch.ops.aten.mm.default in DEVICE_OPS
    assert len(DEVICE_OPS - core) == len(refdev.DEVICE_RUNTIME_OPS)  # runtime ops: the only extras


# -- training ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: TransformerBlock(dropout=0.0), SmallCNN], ids=["transformer", "cnn"])
def test_training_matches_cpu(enabled, make):
    torch.manual_seed(0)
    native = make()
    ours = copy.deepcopy(native).to(DEV)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    x, y = type(native).batch()
    with refdev.op_log() as ran:
        for _ in range(3):
            ln, lossn, gn = train_step(native, opt_n, x, y)
            lo, losso, go = train_step(ours, opt_o, x.to(DEV), y.to(DEV))
            assert lo.device.type == DEV.type and all(g.device.type == DEV.type for g in go)
            torch.testing.assert_close(lo.cpu(), ln, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(losso.cpu(), lossn, rtol=1e-5, atol=1e-6)
            for a, b in zip(go, gn):
                torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-6)
    assert _max_param_diff(native, ours.cpu(), gn) < 1e-5
    # the witness: only the device's own ops ran on it, and decomposed ops did reach it
    assert set(ran) <= DEVICE_OP_NAMES, set(ran) - DEVICE_OP_NAMES
    report = enabled.report()
    assert report.decomposed and not report.by_route("unsupported")
    assert any("backward" in r.op for r in report.decomposed)  # autograd's ops took the same path


def test_silu_decomposes_onto_device_kernels(enabled):
    x = torch.randn(5, 7)
    with refdev.op_log() as ran:
        out = F.silu(x.to(DEV))
    assert_same(F.silu(x), out)
    assert "sigmoid" in ran and "mul.Tensor" in ran and not any("silu" in k for k in ran)


def test_composite_ops_are_taken_over(enabled):
    # index_put_ has a composite kernel that would call the internal _index_put_impl_ (no
    # decomposition); the switch takes index_put_ itself, as EagerDecompMode would see it
    w, idx = torch.randn(5, 3), torch.tensor([0, 3])
    d = w.to(DEV)
    w[idx] = 0.5
    d[idx.to(DEV)] = 0.5
    assert_same(w, d)
    F.silu(d)
    rows = {r.op: r.route for r in enabled.report().rows}
    assert rows["aten.index_put_.default"] == "decomposed" and rows["aten.silu.default"] == "decomposed"
    assert "aten.silu.out" not in rows
    # detach keeps PyTorch's composite kernel (Parameter() wraps its result)
    p = torch.nn.Parameter(torch.randn(3, device=DEV))
    assert type(p) is torch.nn.Parameter and p.device.type == DEV.type


def test_dropout_follows_the_global_seed(enabled):
    x = torch.ones(64, 64, device=DEV)
    torch.manual_seed(3)
    a = F.dropout(x, 0.5).cpu()
    torch.manual_seed(3)
    b = F.dropout(x, 0.5).cpu()
    c = F.dropout(x, 0.5).cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)
    assert set(a.unique().tolist()) == {0.0, 2.0}


# -- eager semantics: in-place, out=, views -------------------------------------------------------


INPLACE = {
    "add_": lambda t: t.add_(torch.ones_like(t), alpha=2),
    "mul_": lambda t: t.mul_(3.0),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5),
    "addcmul_": lambda t: t.addcmul_(t, t, value=0.5),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, 1.5),
    "zero_": lambda t: t.zero_(),
    "transposed view add_": lambda t: t.t().add_(1.0),
}


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_returns_the_same_object(enabled, name):
    fn = INPLACE[name]
    x = torch.randn(4, 4)
    d = x.to(DEV)
    rc, rd = fn(x), fn(d)
    assert_same(rc, rd)
    assert_same(x, d)  # the base saw the write
    assert same_storage(rd, d)


def test_out_returns_the_caller_tensor_and_resizes_like_cpu(enabled):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    for out_c, out_d in [
        (torch.empty(3, 4), torch.empty(3, 4, device=DEV)),
        (torch.empty(0), torch.empty(0, device=DEV)),
    ]:
        rc = torch.addcmul(a, a, b, value=2.0, out=out_c)
        rd = torch.addcmul(a.to(DEV), a.to(DEV), b.to(DEV), value=2.0, out=out_d)
        assert rd is out_d and rc is out_c
        assert_same(out_c, out_d)


VIEWS = {
    "t": lambda t: t.t(),
    "transpose": lambda t: t.transpose(0, 1),
    "slice": lambda t: t[1:, ::2],
    "select": lambda t: t[2],
    "diagonal": lambda t: t.diagonal(1),
    "unfold": lambda t: t.unfold(0, 2, 1),
    "view": lambda t: t.view(-1),
    "expand": lambda t: t[:1].expand(3, 4),
    "narrow": lambda t: t.narrow(1, 1, 2),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "view_as_dtype": lambda t: t.view(torch.int32),
}


@pytest.mark.parametrize("name", VIEWS)
def test_views_alias_like_cpu(enabled, name):
    fn = VIEWS[name]
    x = torch.randn(4, 4)
    d = x.to(DEV)
    vc, vd = fn(x), fn(d)
    assert_same(vc, vd)
    assert same_storage(vd, d)
    d.add_(1.0)  # a write to the base shows through the view, as on CPU
    x.add_(1.0)
    assert_same(fn(x), fn(d))
    assert_same(vc, vd)


def test_split_outputs_alias_the_input(enabled):
    x = torch.randn(6, 3)
    d = x.to(DEV)
    for pc, pd in zip(torch.split(x, [2, 4]), torch.split(d, [2, 4])):
        assert_same(pc, pd)
        assert same_storage(pd, d)


@pytest.mark.parametrize("op", ["t_", "squeeze_", "unsqueeze_", "transpose_"])
def test_metadata_mutating_ops_restride_the_same_object(enabled, op):
    args = {"t_": (), "squeeze_": (), "unsqueeze_": (1,), "transpose_": (0, 1)}[op]
    x = torch.randn(3, 1, 4) if op != "t_" else torch.randn(3, 5)
    d = x.to(DEV)
    rc, rd = getattr(x, op)(*args), getattr(d, op)(*args)
    assert rc is x and rd is d
    assert_same(x, d)


def test_resize_and_item(enabled):
    x = torch.arange(6.0)
    d = x.to(DEV)
    x.resize_(2, 5)
    d.resize_(2, 5)
    assert_same(x[0, : 6 // 2], d[0, : 6 // 2])
    assert x.shape == d.shape and x.stride() == d.stride()
    assert d[0, 1].item() == 1.0


# -- errors ----------------------------------------------------------------------------------------


def test_op_without_a_path_raises_unsupported(enabled):
    x = torch.randn(5, 5, device=DEV)
    with pytest.raises(UnsupportedOpError, match=r"aten\._linalg_svd\S* has no path to the target opset") as info:
        torch.linalg.svd(x)  # SVD is declined by design: its vectors' signs are LAPACK's to choose
    assert "fallthrough" not in str(info.value)  # a device has no native kernel to fall to


def test_user_decomposition_fills_a_gap(disabled):
    # eagerdecomp declines mode along more than 16 elements; a user who knows the values are
    # distinct fills it (every value occurs once: the mode is the smallest, at its index)
    calls = []

    def mode(x, dim=-1, keepdim=False):
        calls.append(x.shape)
        return torch.min(x, dim, keepdim)

    device_switch.enable(DEV, decompositions={"aten::mode.default": mode})
    try:
        x = torch.randn(4, 20)
        got = torch.mode(x.to(DEV), 1)
        want = torch.mode(x, 1)
        assert_same(want.values, got.values)
        assert_same(want.indices, got.indices)
        assert calls  # the user's decomposition answered
    finally:
        device_switch.disable(DEV)


def test_taken_over_op_without_a_path_keeps_its_composite(disabled):
    # a decomposition that leads nowhere (SVD has no path): transpose runs PyTorch's own
    # composite kernel instead, exactly as on the device without eagerdecomp
    stuck = {"aten::transpose.int": lambda x, a, b: torch.linalg.svd(x)[0]}
    b = device_switch.enable(DEV, decompositions=stuck)
    try:
        x = torch.randn(3, 4)
        got = x.to(DEV).transpose(0, 1)
        assert_same(x.transpose(0, 1), got)
        assert b.kept_composite[torch.ops.aten.transpose.int] == 1
        assert not b.report().by_route("unsupported")
    finally:
        device_switch.disable(DEV)


def test_enable_twice_disable_twice(disabled):
    b = device_switch.enable(DEV)
    try:
        assert device_switch.enable(DEV.type) is b  # same settings: a no-op
        assert device_switch.enabled(DEV) is b and device_switch.enabled() == [DEV.type]
        with pytest.raises(BackendError, match=r"already enabled with other settings; call eagerdecomp\.disable"):
            device_switch.enable(DEV, "core_aten")
    finally:
        assert device_switch.disable(DEV) is True
    assert device_switch.disable(DEV) is False and device_switch.enabled(DEV) is None
    with pytest.raises(NotImplementedError, match="silu"):  # the fallback is really gone
        F.silu(torch.randn(3, device=DEV))


@pytest.mark.parametrize(
    "device, message",
    [
        ("nosuchdevice", r"unknown device 'nosuchdevice'.*Load the device's extension"),
        ("cpu", r"device type 'cpu' has no dispatch key eagerdecomp can take over; expected one of"),
    ],
)
def test_enable_rejects_devices(device, message):
    with pytest.raises(BackendError, match=message):
        device_switch.enable(device)


def test_enable_rejects_an_opset_op_the_device_lacks(disabled):
    with pytest.raises(BackendError, match=r"claims 1 op\(s\) the device has no kernel for: aten\.silu\.default"):
        device_switch.enable(DEV, DEVICE_OPS | ["aten::silu.default"])
    with pytest.raises(BackendError, match="on_unsupported='fallthrough' is not available for a device"):
        device_switch.enable(DEV, on_unsupported="fallthrough")
    assert device_switch.enabled(DEV) is None


@pytest.mark.parametrize("preset", ["prims", "prims_fusion"])
def test_enable_refuses_a_prims_opset_on_a_core_device(disabled, preset):
    # NOTE: every prims op has a CompositeExplicitAutograd kernel (its aten implementation), which
    # runs on any key; it is not edref's, and counting it let edref "speak" prims while receiving aten
    # (a CompositeImplicitAutograd op, set_.source_Tensor_storage_offset, never reaches a device)
    implicit = torch._C._dispatch_has_kernel_for_dispatch_key
    missing = sorted(
        str(op)
        for op in ed.OpSet.preset(preset)
        if op not in DEVICE_OPS and not implicit(op.name(), "CompositeImplicitAutograd")
    )
    assert "prims.add.default" in missing
    with pytest.raises(
        BackendError, match=rf"the opset {preset} claims {len(missing)} op\(s\) the device has no kernel for"
    ) as e:
        device_switch.enable(DEV, preset)
    assert missing[0] in str(e.value) and "a composite kernel does not count" in str(e.value)
    assert device_switch.enabled(DEV) is None


def test_explicit_opset_narrows_where_decomposition_stops(disabled):
    narrow = DEVICE_OPS - ["aten::sigmoid"]
    device_switch.enable(DEV, narrow)
    try:
        x = torch.randn(6)
        with refdev.op_log() as ran:
            out = F.silu(x.to(DEV))
        assert_same(F.silu(x), out)
        assert "sigmoid" not in ran and "exp" in ran
    finally:
        device_switch.disable(DEV)


# -- processes: the environment switch and the pure-Python path -------------------------------


def _run(code: str, **env):
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=300
    )


def test_environment_switch_enables_the_device():
    r = _run(
        """
        import torch, torch.nn.functional as F
        from eagerdecomp import device
        [switch] = device.enable_from_env()
        x = torch.randn(8)
        print(switch.device, torch.allclose(F.silu(x.to("edref")).cpu(), F.silu(x)))
        """,
        EAGERDECOMP_DEVICES="edref",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["edref", "True"]


def test_former_names_still_work_and_say_they_are_deprecated():
    # eagerdecomp.backend and EAGERDECOMP_BACKENDS, the device switch's names before 0.2
    r = _run(
        """
        import warnings; warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as seen:
            import eagerdecomp as ed
            import eagerdecomp.backend as b
        kinds = {str(w.category.__name__) for w in seen if "deprecated" in str(w.message)}
        print(b is ed.device, b.enabled(), sorted(kinds))
        """,
        EAGERDECOMP_BACKENDS="edref",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "['edref']", "['DeprecationWarning']"]


@pytest.mark.skipif(
    not hasattr(ed, "enable"), reason="eagerdecomp/__init__.py does not call device_switch.enable_from_env yet"
)
def test_environment_switch_at_import():
    r = _run(
        """
        import torch, torch.nn.functional as F
        import eagerdecomp as ed
        x = torch.randn(8)
        print(ed.device.enabled(), torch.allclose(F.silu(x.to("edref")).cpu(), F.silu(x)))
        """,
        EAGERDECOMP_DEVICES="edref",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['edref']", "True"]


def test_reference_device_after_a_backward_pass_is_a_clear_error():
    r = _run(
        """
        import torch
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()
        from eagerdecomp.device.refdev import reference_device
        try:
            reference_device()
        except Exception as e:
            print(type(e).__name__, "Call it at the start of the program" in str(e))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["BackendError", "True"]


def test_library_works_without_the_extension():
    r = _run(
        """
        import warnings; warnings.simplefilter("error")  # forcing the pure-Python path warns about nothing
        import torch, torch.nn.functional as F
        import eagerdecomp as ed
        from eagerdecomp.runtime import key, library as _ext
        from eagerdecomp.device.refdev import reference_device
        x = torch.randn(8)
        with ed.EagerDecompMode("core_aten"):
            y = F.silu(x)
        print(_ext.status()["loaded"], key.IMPLEMENTATION, torch.allclose(y, F.silu(x)))
        try:
            reference_device()
        except ed.EagerDecompError as e:
            print(type(e).__name__, "unset EAGERDECOMP_NO_EXT" in str(e))
        """,
        EAGERDECOMP_NO_EXT="1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["disabled", "python", "True", "BackendError", "True"]


def test_info_says_what_is_loaded():
    r = _run("import runpy; runpy.run_module('eagerdecomp.info', run_name='__main__')", EAGERDECOMP_NO_EXT="1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^C\+\+ library +disabled$", r.stdout, re.M), r.stdout
    assert re.search(rf"^torch +{re.escape(torch.__version__)} ", r.stdout, re.M), r.stdout
    assert re.search(r"^C\+\+ hit path / CPU tier +not built / not built$", r.stdout, re.M), r.stdout


def test_an_op_without_a_meta_kernel_keeps_eagers_layout(enabled):
    # geqrf has no meta kernel: on the device its layout comes from the CPU kernel on zeros
    # (LAPACK's column-major), which the decomposition's row-major result is moved to
    a = torch.randn(2, 5, 3)
    q, tau = torch.geqrf(a.to(DEV))
    qc, tauc = torch.geqrf(a)
    assert q.stride() == qc.stride() == (15, 1, 5)
    torch.testing.assert_close(q.cpu(), qc, rtol=1e-5, atol=1e-5)
    assert_same(tauc, tau)


def test_cat_out_overlapping_an_input_is_resized_before_eagers_error(enabled):
    # cat's kernel resizes its out, then finds it among its inputs: eager raises with it resized
    got = {}
    for where in ("cpu", DEV):
        a = torch.arange(4.0).to(where)
        v = a._version
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.cat([a, a], out=a)
        got[str(where)] = (a, a._version - v)
    (a, va), (d, vd) = got["cpu"], got[str(DEV)]
    assert (d.shape, d.stride(), d.storage_offset(), vd) == (a.shape, a.stride(), a.storage_offset(), va)
    assert torch.equal(d.cpu()[:4], a[:4])  # (beyond the old elements: uninitialized in both)


@pytest.mark.parametrize("trace_after", ["2", "0"])
def test_cpu_indices_into_device_data_and_their_backward_run_as_eager(enabled, monkeypatch, trace_after):
    # eager lets an index tensor stay on the CPU whatever device the data is on (SAM's relative
    # positions): the backward's index_put_ took it too, but its meta kernel over fake tensors
    # refused the devices' mix, so edref raised where eager runs
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", trace_after)
    idx = torch.tensor([0, 2, 2, 4])
    for n in (5, 5, 5, 6):  # (direct calls, then the traced kernel; another shape)
        base = torch.randn(n, 3)
        x = base.to(DEV).requires_grad_()
        ref = base.clone().requires_grad_()
        y, want = x[idx], ref[idx]
        (y * y).sum().backward()
        (want * want).sum().backward()
        assert y.device == x.device
        torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)
        torch.testing.assert_close(x.grad.cpu(), ref.grad)  # (to rounding: index_put_'s accumulation)
        assert x.grad.stride() == ref.grad.stride()
