"""The CPU tier (eagerdecomp.runtime.host, csrc/host.cpp) on the strict reference device edref.

Every result is compared with the same call on CPU tensors in eager: values bitwise (the
CPU kernel runs on the same bytes), dtype, shape, strides, identity of in-place and out=
results, version counters. A recording mode entered outside ours witnesses what reached
the device.
"""

import logging

import pytest
import torch
import torch.nn.functional as F

from eagerdecomp import EagerDecompMode
from eagerdecomp import device as device_switch
from eagerdecomp.errors import BackendError, DeviceMismatchError, UnsupportedOpError
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import host

refdev = pytest.importorskip("eagerdecomp.device.refdev")
try:
    DEV = refdev.reference_device()
except BackendError as e:
    pytest.skip(f"reference device unavailable: {e}", allow_module_level=True)

aten = torch.ops.aten
SYM = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]], dtype=torch.float64)


@pytest.fixture
def tier(monkeypatch):
    """The switch on edref with the CPU tier; lists read from the environment at enable."""

    def make(**env):
        for k in (host.ENV_OPS, host.ENV_DENY):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        device_switch.disable(DEV)
        return device_switch.enable(DEV, on_unsupported="cpu")

    yield make
    device_switch.disable(DEV)


def same(cpu, dev):
    assert dev.device.type == DEV.type
    assert (dev.dtype, dev.shape, dev.stride()) == (cpu.dtype, cpu.shape, cpu.stride())
    assert torch.equal(dev.cpu(), cpu)


def host_calls(switch, op) -> int:
    """Calls of ``op`` the C++ fallback served on the host (no Python)."""
    return sum(n for o, kind, n, *_ in switch.runtime.hit_counts.counts() if o is op and kind & 4)


def test_no_path_raises_without_the_tier():
    device_switch.disable(DEV)
    device_switch.enable(DEV)
    try:
        with pytest.raises(UnsupportedOpError, match="_linalg_eigh"):
            torch.linalg.eigh(SYM.to(DEV))
    finally:
        device_switch.disable(DEV)


def test_runs_on_cpu_exactly_and_on_the_record(tier):
    switch = tier()
    for _ in range(3):
        L, Q = torch.linalg.eigh(SYM.to(DEV))
        Lc, Qc = torch.linalg.eigh(SYM)
        same(Lc, L)
        same(Qc, Q)
    op = aten._linalg_eigh.eigenvalues  # (the composite _linalg_eigh calls its out= form)
    row = switch.report().row(op)
    assert row.route == "cpu fallback" and row.calls == 3
    assert "_linalg_eigh" in row.blocked_by and "no decomposition" in row.blocked_by
    assert row.to_host >= SYM.nbytes * 3 and row.to_device >= (SYM.nbytes + 3 * 8) * 3
    assert host_calls(switch, op) == 2  # the first call decided in Python, later ones in C++


def test_another_switch_does_not_run_the_tiers_programs(tier):
    tier()
    torch.linalg.eigh(SYM.to(DEV))
    torch.linalg.eigh(SYM.to(DEV))  # installed for the key, served on the host
    device_switch.disable(DEV)
    device_switch.enable(DEV)  # the same kernel cache and C++ table, no tier
    with pytest.raises(UnsupportedOpError):
        torch.linalg.eigh(SYM.to(DEV))


def test_out_resized_in_place_with_eager_version_counts(tier):
    tier()
    outs = {}
    for where in ("cpu", DEV):
        L = torch.empty(0, dtype=torch.float64, device=where)
        Q = torch.empty(0, dtype=torch.float64, device=where)
        v = (L._version, Q._version)
        r = torch.linalg.eigh(SYM.to(where), out=(L, Q))
        assert r[0] is L and r[1] is Q
        outs[str(where)] = (L, Q, (L._version - v[0], Q._version - v[1]))
    (Lc, Qc, vc), (L, Q, vd) = outs["cpu"], outs[str(DEV)]
    same(Lc, L)
    same(Qc, Q)
    assert vd == vc


def test_out_of_the_wrong_shape_warns_as_eager(tier):
    tier()
    L = torch.zeros(2, dtype=torch.float64, device=DEV)
    Q = torch.zeros(3, 3, dtype=torch.float64, device=DEV)
    with pytest.warns(UserWarning, match="resized"):
        torch.linalg.eigh(SYM.to(DEV), out=(L, Q))
    same(torch.linalg.eigh(SYM)[0], L)


def test_deny_list_refuses(tier):
    tier(EAGERDECOMP_CPU_FALLBACK_DENY="aten::_linalg_eigh")
    with pytest.raises(UnsupportedOpError, match="EAGERDECOMP_CPU_FALLBACK_DENY"):
        torch.linalg.eigh(SYM.to(DEV))


def test_allow_list_limits_the_tier(tier):
    tier(EAGERDECOMP_CPU_FALLBACK_OPS="_linalg_svd")
    with pytest.raises(UnsupportedOpError, match="EAGERDECOMP_CPU_FALLBACK_OPS"):
        torch.linalg.eigh(SYM.to(DEV))
    U, S, Vh = torch.linalg.svd(SYM.to(DEV))
    same(torch.linalg.svd(SYM)[1], S)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_one_warning_per_op(tier):
    tier()
    log, records = logging.getLogger("eagerdecomp"), Records()
    log.addHandler(records)
    try:
        torch.linalg.eigh(SYM.to(DEV))
        torch.linalg.eigh(SYM[:2, :2].to(DEV))  # another key, the same op
    finally:
        log.removeHandler(records)
    warned = [m for m in records.messages if "running it on the CPU" in m]
    assert len(warned) == 1 and "_linalg_eigh" in warned[0]


def test_fallback_inside_backward_gives_eagers_gradient(tier):
    switch = tier()
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    grid = torch.rand(1, 4, 4, 2, dtype=torch.float64) * 2 - 1
    grads = {}
    for where in ("cpu", DEV):
        xs = x.to(where).detach().requires_grad_()
        gs = grid.to(where).detach().requires_grad_()
        F.grid_sample(xs, gs, mode="bicubic", align_corners=False).sum().backward()
        grads[str(where)] = (xs.grad, gs.grad)
    same(grads["cpu"][0], grads[str(DEV)][0])
    same(grads["cpu"][1], grads[str(DEV)][1])
    assert switch.report().row(aten.grid_sampler_2d_backward.default).route == "cpu fallback"


def test_enable_from_env_turns_the_tier_on():
    device_switch.disable(DEV)
    try:
        (switch,) = device_switch.enable_from_env("edref:cpu")
        assert switch.runtime.host is not None
        same(torch.linalg.eigvalsh(SYM), torch.linalg.eigvalsh(SYM.to(DEV)))
        with pytest.raises(BackendError, match="':cpu'"):
            device_switch.enable_from_env("edref:gpu")
    finally:
        device_switch.disable(DEV)


# -- the mode on an accelerator: a narrow opset sends most ops to the tier ----------------

NARROW = OpSet(["aten::empty.memory_format", "aten::empty_strided.default"], name="narrow")


class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Entered outside ours: sees the ops our mode runs below it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_mode_in_place_lands_in_the_callers_tensor():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    expect = x.clone().add_(y, alpha=2)
    xd = x.to(DEV)
    v = xd._version
    with EagerDecompMode(NARROW, on_unsupported="cpu") as mode:
        r = xd.add_(y.to(DEV), alpha=2)
    assert r is xd and xd._version == v + 1
    same(expect, xd)
    assert mode.report().row(aten.add_.Tensor).route == "cpu fallback"


def test_mode_keeps_eagers_overlap_error():
    # a write overlapping its own input: eager refuses; copies made one by one would not see it
    x = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="single memory location") as eager:
        x[1:].add_(x[:-1])
    xd = torch.arange(6.0).to(DEV)
    a, b = xd[1:], xd[:-1]  # views made before entering the mode
    with EagerDecompMode(NARROW, on_unsupported="cpu"), pytest.raises(RuntimeError) as ours:
        a.add_(b)
    assert "single memory location" in str(ours.value), (str(eager.value), str(ours.value))


def test_mode_keeps_strides_of_non_dense_inputs():
    # TensorIterator lays its result out after its inputs' strides: copies made contiguous
    # (at::native::cpu_fallback's) would give another layout
    a, b = torch.randn(3, 1), torch.randn(4, 3)
    ad, bd = a.to(DEV).expand(3, 4), b.to(DEV).t()  # views made before entering the mode
    with EagerDecompMode(NARROW, on_unsupported="cpu"):
        r = torch.mul(ad, bd)
    same(torch.mul(a.expand(3, 4), b.t()), r)


def test_mode_refuses_views():
    with EagerDecompMode(NARROW, on_unsupported="cpu"), pytest.raises(UnsupportedOpError, match="alias an input"):
        torch.randn(2, 3).to(DEV).t()


def test_mode_mixed_devices_are_refused_as_eager_refuses():
    x, y = torch.randn(3).to(DEV), torch.randn(3)
    with pytest.raises(RuntimeError, match="same device"):
        x.add(y)
    with EagerDecompMode(NARROW, on_unsupported="cpu"), pytest.raises(DeviceMismatchError, match="one device"):
        x.add(y)


def test_mode_random_draws_the_devices_stream_or_is_refused(monkeypatch):
    torch.manual_seed(7)
    expect = torch.rand(5)
    with EagerDecompMode(NARROW, on_unsupported="cpu"):
        torch.manual_seed(7)
        got = torch.rand(5, device=DEV)  # edref's generator is the CPU's
        same(expect, got)
    # NOTE: a tier decides an (op, device) once, at its first call, as the device switch does
    # (the mode's C++ key then serves the key on the host with no Python): a device whose
    # generator is not the CPU's is refused there, by a fresh mode (a tier of its own)
    other = EagerDecompMode(NARROW, on_unsupported="cpu")
    monkeypatch.setattr(other.runtime.host, "_draws_from_cpu", lambda device: False)
    with other, pytest.raises(UnsupportedOpError, match="generator is not the CPU's"):
        torch.rand(5, device=DEV)


def test_mode_on_cpu_tensors_falls_through():
    with EagerDecompMode(NARROW, on_unsupported="cpu") as mode:
        r = torch.randn(3).add(1)
    assert r.device.type == "cpu"
    assert mode.report().row(aten.add.Tensor).fallthrough == 1


def test_nothing_reaches_below_the_mode_but_the_call():
    x = torch.randn(3).to(DEV)
    rec = Recorder()
    with rec, EagerDecompMode(NARROW, on_unsupported="cpu"):
        torch.mul(x, 2.0)
    # the CPU kernel runs on the CPU key and the host copies under no mode: a recorder entered
    # outside ours sees nothing of the call (its meta check included)
    assert rec.ops == []


def test_argument_rules():
    assert "sparse" in host._argument_refusal((torch.eye(2).to_sparse(),), {})
    q = torch.quantize_per_tensor(torch.randn(2), 0.1, 0, torch.qint8)
    assert "quantized" in host._argument_refusal((q,), {})

    class Sub(torch.Tensor):
        pass

    assert "subclass" in host._argument_refusal((torch.randn(2).as_subclass(Sub),), {})
    assert host._argument_refusal((torch.randn(2), torch.nn.Parameter(torch.randn(2))), {}) is None


def test_profile_shows_the_copy_time():
    from eagerdecomp.profile import profile

    x = torch.randn(64, 64).to(DEV)
    p = profile(torch.mul, x, 2.0, opset=NARROW, on_unsupported="cpu")
    assert p.calls["cpu fallback"] == 1 and 0 < p.copy_s <= p.seconds["cpu fallback"]
    assert "copying" in str(p)
    same(torch.mul(x.cpu(), 2.0), p.result)


def test_a_sparse_result_is_refused_with_the_op_named(tier):
    tier()
    with pytest.raises(RuntimeError, match=r"_to_sparse.*strided results only"):
        torch.randn(2, 2).to(DEV).to_sparse()


def test_threads_share_the_tier(tier):
    # the C++ path keeps no per-call state but the counters: four threads, one key, eager's answers
    import threading

    switch = tier()
    mats = [SYM + i for i in range(4)]
    want = [torch.linalg.eigh(m) for m in mats]
    got, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(25):
                got[i] = torch.linalg.eigh(mats[i].to(DEV))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (L, Q), (Lc, Qc) in zip(got, want):
        same(Lc, L)
        same(Qc, Q)
    assert switch.report().row(aten._linalg_eigh.eigenvalues).on_cpu == 100


def test_an_unknown_name_in_a_list_is_an_error_naming_the_variable(tier):
    from eagerdecomp.errors import UnknownOpError

    with pytest.raises(UnknownOpError, match="EAGERDECOMP_CPU_FALLBACK_DENY: unknown op name 'linalg_eihg'"):
        tier(EAGERDECOMP_CPU_FALLBACK_DENY="linalg_eihg")


# -- lists by the names users type (the device guide's form) -------------------------------


def _fused_adamw_step(where):
    p, g, ea, es = (torch.full((4,), float(i + 1)).to(where) for i in range(4))
    torch._fused_adamw_(
        [p], [g], [ea], [es], [], [torch.tensor(1.0).to(where)],
        lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
    )  # fmt: skip
    return p


def test_deny_list_takes_the_names_the_guide_gives(tier):
    pytest.importorskip("expecttest")  # linalg_eigh's composite is run on PyTorch's OpInfo samples
    tier()
    same(_fused_adamw_step("cpu"), _fused_adamw_step(DEV))  # on the tier without a list
    # linalg_eigh arrives as _linalg_eigh.eigenvalues, a fused AdamW step as _fused_adamw_
    tier(EAGERDECOMP_CPU_FALLBACK_DENY="linalg_eigh,_fused_adamw")
    with pytest.raises(UnsupportedOpError, match=r"(?s)_linalg_eigh\.eigenvalues.*EAGERDECOMP_CPU_FALLBACK_DENY"):
        torch.linalg.eigh(SYM.to(DEV))
    with pytest.raises(UnsupportedOpError, match=r"(?s)_fused_adamw_.*EAGERDECOMP_CPU_FALLBACK_DENY"):
        _fused_adamw_step(DEV)


def test_allow_list_takes_the_names_the_guide_gives(tier):
    pytest.importorskip("expecttest")
    switch = tier(EAGERDECOMP_CPU_FALLBACK_OPS="linalg_eigh")
    L, Q = torch.linalg.eigh(SYM.to(DEV))
    Lc, Qc = torch.linalg.eigh(SYM)
    same(Lc, L)
    same(Qc, Q)
    assert switch.report().row(aten._linalg_eigh.eigenvalues).route == "cpu fallback"
    with pytest.raises(UnsupportedOpError, match="EAGERDECOMP_CPU_FALLBACK_OPS"):
        torch.linalg.svd(SYM.to(DEV))


# -- a taken-over composite whose decomposition is blocked at an op the tier runs ----------


def test_mode_out_over_more_than_16_elements_reaches_the_tier(tier):
    # mode's decomposition declines rows longer than 16 (libstdc++'s sort order of ties); the
    # composite kernel of mode.values rejects any device but CPU, CUDA and XPU
    switch = tier()
    x = torch.randint(0, 4, (3, 20)).to(torch.float64)  # ties: the index is the kernel's own
    got = {}
    for where in ("cpu", DEV):
        v = torch.empty(0, dtype=torch.float64, device=where)
        i = torch.empty(0, dtype=torch.int64, device=where)
        before = (v._version, i._version)
        r = torch.mode(x.to(where), 1, out=(v, i))
        assert r[0] is v and r[1] is i
        got[str(where)] = (v, i, (v._version - before[0], i._version - before[1]))
    (vc, ic, nc), (vd, idd, nd) = got["cpu"], got[str(DEV)]
    same(vc, vd)
    same(ic, idd)
    assert nd == nc
    assert switch.report().row(aten.mode.default).route == "cpu fallback"
    same(torch.mode(x, 0)[1], torch.mode(x.to(DEV), 0)[1])  # (3 <= 16: the decomposition's own)


def test_profiler_names_a_tier_call_by_what_ran(tier):
    # the first call of a key is decided in Python: nothing is traced (the op has no
    # decomposition), the CPU kernel runs inside a range naming the tier
    tier()
    x = (SYM + 7).to(DEV)[:2, :2]  # a key no other test made
    with torch.profiler.profile() as prof:
        L, _ = torch.linalg.eigh(x)
    names = [e.name for e in prof.events() if e.name.startswith("eagerdecomp.")]
    assert names == ["eagerdecomp.cpu_fallback aten._linalg_eigh.eigenvalues"], names
    (rng,) = [e for e in prof.events() if e.name == names[0]]
    # the CPU kernel ran inside it (redispatched to the CPU key, it shows as what it calls: the
    # LAPACK error check of the CPU kernel, which no meta kernel makes)
    kernel = [e for e in prof.events() if e.name == "aten::_linalg_check_errors"]
    assert any(rng.time_range.start <= k.time_range.start <= k.time_range.end <= rng.time_range.end for k in kernel)
    same(torch.linalg.eigh(SYM[:2, :2] + 7)[0], L)
