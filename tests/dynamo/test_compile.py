"""torch.compile with backend="eagerdecomp" under EagerDecompMode: compiled graphs and the
eager regions between graph breaks both reach only opset ops, and results match native eager.

The independent witness is eagerdecomp.testing.RecordingMode entered outside everything; the
backend's own record of its graphs is the second view.
"""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._dynamo.utils import counters

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.dynamo.backend import compile_backend
from eagerdecomp.errors import BackendError
from eagerdecomp.runtime.stats import Route
from eagerdecomp.testing import RecordingMode

F = torch.nn.functional
aten = torch.ops.aten

# NOTE: the reference device must be registered before the first backward() of the process:
# the autograd engine sizes its per-device queues then (a later device trips an internal assert).
# Collection imports this module before any test runs, so load it here.
try:
    from eagerdecomp.device.refdev import reference_device

    REF_DEV, REF_DEV_ERROR = reference_device(), None
except Exception as e:  # every other test still runs; the device test reports it
    REF_DEV, REF_DEV_ERROR = None, e


class Witness(RecordingMode):
    """RecordingMode that lets dynamo compile while it is on the stack.

    Dynamo skips every frame while a mode without ``ignore_compile_internals`` is active;
    this one is switched off only while dynamo compiles, and records every op that runs.
    """

    @classmethod
    def ignore_compile_internals(cls):
        return True


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@torch.compiler.disable
def eager_tail(x):
    """Dynamo never captures this: it runs eagerly (under the mode: decomposed)."""
    return F.softplus(x) + F.hardswish(x)


def break_explicit(x, w):
    y = F.silu(x * w)
    torch._dynamo.graph_break()
    return F.logsigmoid(y).mean(-1)


def break_print(x, w):
    y = F.silu(x * w)
    print("graph break by print")
    return F.logsigmoid(y).mean(-1)


def break_data_dependent(x, w):
    y = F.silu(x * w)
    if y.sum() > 0:  # needs the value: dynamo breaks the graph here
        y = F.elu(y)
    else:
        y = F.hardsigmoid(y)
    return F.logsigmoid(y).mean(-1)


def break_disabled(x, w):
    y = F.silu(x * w)
    y = eager_tail(y)
    return F.logsigmoid(y).mean(-1)


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def graph_kinds(backend):
    return [g.kind for g in backend.graphs]


@pytest.mark.parametrize("fn", [break_explicit, break_print, break_data_dependent, break_disabled])
def test_graph_breaks_match_native_and_stay_in_opset(fn):
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, requires_grad=True)
    backend = compile_backend("core_aten")
    compiled = torch.compile(fn, backend=backend)
    with Witness() as rec, ed.EagerDecompMode("core_aten") as mode:
        out = compiled(x, w)
        out.sum().backward()
    got = (out.detach(), x.grad, w.grad)
    x.grad = w.grad = None
    want = fn(x, w)
    want.sum().backward()

    for a, b in zip(got, (want.detach(), x.grad, w.grad)):
        assert_same(a, b)
    # the break happened (one graph each side) and both sides compiled, forward and backward,
    # under the mode: without ignore_compile_internals dynamo would have compiled nothing
    assert graph_kinds(backend).count("forward") >= 2
    assert "backward" in graph_kinds(backend)
    # the backend's view: only opset ops in what it produced ...
    assert backend.outside_opset() == []
    assert not any(op in backend.ops() for op in (aten.silu.default, aten.log_sigmoid_forward.default))
    # ... and the witness's: only opset ops ran, compiled graphs included
    rec.assert_only("core_aten")
    assert set(backend.ops()) <= set(rec.ops)
    # compiled graphs reach the mode as pass-through ops; it decomposes nothing of theirs
    assert set(backend.ops()) <= mode.runtime.stats.ops(Route.PASSTHROUGH)


def test_disabled_region_is_decomposed_by_the_mode():
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    backend = compile_backend("core_aten")
    with Witness() as rec, ed.EagerDecompMode("core_aten") as mode:
        compiled_out = torch.compile(break_disabled, backend=backend)(x, w)
        compiled_out.sum().backward()
    report = mode.report()
    for op in (aten.softplus.default, aten.hardswish.default, aten.softplus_backward.default):
        row = report.row(op)
        assert row is not None and row.route == "decomposed", op
        assert op not in backend.ops()
    rec.assert_only("core_aten")


@torch.compiler.disable(recursive=False)
def eager_frame(x):
    """Dynamo skips this frame but keeps its hook on for what it calls."""
    return F.softplus(x) * 2


def test_the_mode_runs_with_dynamos_frame_hook_off():
    # NOTE: the mode opts out of TorchDispatchMode's dynamo-disabling wrapper (1 us a call) and
    # turns the hook off itself, only when one is set; what it runs must never see one
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    hooks = []

    def softplus(x, beta=1, threshold=20):
        hooks.append(get_eval_frame_callback())
        return torch._refs.nn.functional.softplus(x, beta, threshold)

    def fn(x):
        return eager_frame(F.silu(x)).sum()

    x = torch.randn(4, 6)
    with ed.EagerDecompMode("core_aten", decompositions={aten.softplus.default: softplus}) as mode:
        got = torch.compile(fn, backend=compile_backend("core_aten"))(x)
    # traced inside the compiled call's eager frame, where dynamo's hook is set: with it off
    assert hooks == [None], hooks
    assert mode.report().row(aten.softplus.default).route == "decomposed"
    torch.testing.assert_close(got, fn(x))
    assert not hasattr(type(mode).__dict__["__torch_dispatch__"], "__wrapped__")  # not torch's wrapper


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # NOTE: no bias right before a norm layer: a parameter whose
        # gradient is exactly zero in math gets rounding noise, which AdamW scales up to lr.
        self.fc1 = torch.nn.Linear(8, 16, bias=False)
        self.bn = torch.nn.BatchNorm1d(16)  # running stats: buffers mutated inside a compiled graph
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = F.gelu(self.bn(self.fc1(x)))
        print("tiny net: graph break")
        if h.mean() > 0:  # data-dependent branch
            h = F.silu(h)
        else:
            h = F.mish(h)
        torch._dynamo.graph_break()
        h = eager_tail(h)
        return self.fc2(self.norm(h))


def train_steps(model, xs, ys, compiled=None, steps=2):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run = model if compiled is None else compiled
    losses = []
    for _ in range(steps):
        for x, y in zip(xs, ys):
            opt.zero_grad()
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    return losses


def test_training_module_matches_native():
    torch.manual_seed(0)
    native = TinyNet()
    model = copy.deepcopy(native)
    xs, ys = [torch.randn(6, 8)], [torch.randint(0, 4, (6,))]
    backend = compile_backend("core_aten")
    compiled = torch.compile(model, backend=backend)
    with Witness() as rec, ed.EagerDecompMode("core_aten") as mode:
        losses = train_steps(model, xs, ys, compiled)
    expected = train_steps(native, xs, ys)

    for a, b in zip(losses, expected):
        assert_same(a, b)
    for (_name, p), q in zip(model.named_parameters(), native.parameters()):
        assert_same(p.detach(), q.detach())
        assert_same(p.grad, q.grad)
    for a, b in zip(model.buffers(), native.buffers()):
        assert_same(a, b)
    kinds = graph_kinds(backend)
    assert kinds.count("forward") >= 3 and kinds.count("backward") >= 3, kinds
    assert backend.outside_opset() == []
    rec.assert_only("core_aten")
    # the optimizer step and the eager tail ran under the mode, decomposed
    decomposed = {row.op for row in mode.report().decomposed}
    assert str(aten.softplus.default) in decomposed
    assert {"aten.addcmul_.default", "aten.addcdiv_.default"} <= decomposed, decomposed  # AdamW


def _stats(mode):
    rows = mode.report().rows
    return sum(r.hits for r in rows), sum(r.misses for r in rows), sum(r.traces for r in rows)


@pytest.mark.usefixtures("trace_first")  # counts a traced kernel's hits
def test_recompile_and_mode_cache_coexist():
    w = torch.randn(6, requires_grad=True)
    backend = compile_backend("core_aten")
    compiled = torch.compile(break_disabled, backend=backend)
    results, marks = [], []

    with Witness() as rec, ed.EagerDecompMode("core_aten") as mode:
        # the second backward accumulates into w.grad (add_, a new eager op): warm up twice
        for rows in (4, 4, 4, 9, 4, 9):
            x = torch.randn(rows, 6, requires_grad=True)
            out = compiled(x, w)
            out.sum().backward()
            results.append((x, out))
            # (graphs compiled so far, dynamo's compile count, mode hits, misses, traces)
            marks.append((len(backend.graphs), counters["stats"]["unique_graphs"], *_stats(mode)))
    # comparisons only now: assert_close itself would run ops under the mode
    for x, out in results:
        assert_same(out.detach(), break_disabled(x.detach(), w.detach()))

    warm, same, new_shape, back, again = marks[1:]
    # same shape: no recompile, every eager kernel of the mode replayed (hits, no traces)
    assert same[:2] == warm[:2] and same[3:] == warm[3:] and same[2] > warm[2]
    # a new shape: dynamo recompiles (more graphs) and the mode answers the new shape's kernels
    assert new_shape[0] > same[0] and new_shape[1] > same[1]
    # (its new exact keys are answered by the shape families traced at the first shape: hits
    # of the mode, no new trace; with families off they are traced)
    assert new_shape[2] > same[2] and new_shape[4] >= same[4]
    # both shapes again: no graph compiled, no kernel traced; only hits
    for m in (back, again):
        assert m[:2] == new_shape[:2] and m[3:] == new_shape[3:]
    assert again[2] > back[2] > new_shape[2]
    rec.assert_only("core_aten")
    assert backend.outside_opset() == []


def _compiled_silu_grad_matches_eager(backend, opset):
    """silu(x).sum() compiled with ``backend`` under a mode for ``opset``: its gradient equals
    eager's. Returns the witness and the mode."""
    x = torch.randn(4, 6, requires_grad=True)
    with Witness() as rec, ed.EagerDecompMode(opset) as mode:
        out = torch.compile(lambda t: F.silu(t).sum(), backend=backend)(x)
        out.backward()
    grad = x.grad
    x.grad = None
    F.silu(x).sum().backward()
    assert_same(grad, x.grad)
    return rec, mode


@pytest.mark.parametrize("backend_name", ["aot_eager", "eagerdecomp-core-under-prims"])
def test_mode_still_guards_graphs_of_another_opset(backend_name):
    # With ignore_compile_internals the mode is off only while dynamo compiles: a compiled graph
    # that still holds ops outside the mode's opset (aot_eager keeps silu; a core_aten backend
    # under a prims mode keeps core ops) meets the mode when it runs and is decomposed there.
    if backend_name == "aot_eager":
        backend, opset, leftover = "aot_eager", "core_aten", aten.silu.default
    else:
        backend, opset, leftover = compile_backend("core_aten"), "prims", aten.sigmoid.default
    rec, mode = _compiled_silu_grad_matches_eager(backend, opset)
    assert mode.report().row(leftover).route == "decomposed"
    rec.assert_only(opset)


def test_tensor_constants_in_a_compiled_graph():
    # torch.tensor() inside the compiled region: AOTAutograd makes it a graph constant
    # (lift_fresh -> lift_fresh_copy), which the backend hands on as a core clone
    def f(x):
        idx = torch.tensor([0, 2])
        return F.embedding(idx, x).sum() * torch.tensor(3.0) + F.interpolate(x[None, None], scale_factor=2).mean()

    x = torch.randn(4, 4, requires_grad=True)
    backend = compile_backend("core_aten")
    with Witness() as rec, ed.EagerDecompMode("core_aten"):
        out = torch.compile(f, backend=backend)(x)
        out.backward()
    grad = x.grad
    x.grad = None
    want = f(x)
    want.backward()
    assert_same(out.detach(), want.detach())
    assert_same(grad, x.grad)
    assert aten.clone.default in backend.ops() and backend.outside_opset() == []
    rec.assert_only("core_aten")


def test_dropout_in_a_compiled_graph_follows_the_seed():
    def f(x):
        return F.dropout(x, 0.5, training=True) * 2

    x = torch.randn(8, 8)
    compiled = torch.compile(f, backend=compile_backend("core_aten"))
    with Witness() as rec, ed.EagerDecompMode("core_aten"):
        compiled(x)  # compile outside the seeded region
        torch.manual_seed(1)
        first = compiled(x)
        second = compiled(x)
    torch.manual_seed(1)
    assert_same(first, f(x))
    assert_same(second, f(x))
    assert not torch.equal(first, second)  # fresh numbers on each call
    rec.assert_only("core_aten")


def test_user_compiler_gets_lowered_graphs_outside_every_mode():
    seen = []

    def my_compiler(gm, example_inputs):
        seen.append((gm, torch._C._len_torch_dispatch_stack()))
        return gm.forward  # unboxed: the backend boxes it

    x = torch.randn(5, requires_grad=True)
    backend = compile_backend("core_aten", compiler=my_compiler)
    with ed.EagerDecompMode("core_aten"):
        out = torch.compile(lambda t: F.softplus(t).sum(), backend=backend)(x)
        out.backward()  # the backward graph is compiled here, lazily, under the mode
    want_grad = torch.sigmoid(x.detach())
    assert_same(x.grad, want_grad)
    assert len(seen) == 2
    assert [g.graph_module for g in backend.graphs] == [gm for gm, _ in seen]
    assert all(depth == 0 for _, depth in seen)
    core = ed.OpSet.coerce("core_aten")
    for gm, _ in seen:
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert targets and all(t in core for t in targets), targets


def test_op_without_decomposition_is_named():
    # mm has no decomposition: without it in the opset, the graph cannot be lowered
    opset = ed.OpSet.coerce("core_aten") - ed.OpSet(["aten::mm"])
    backend = compile_backend(opset)
    with pytest.raises(BackendCompilerFailed) as info:
        torch.compile(lambda a, b: (a @ b).relu(), backend=backend)(torch.randn(2, 3), torch.randn(3, 2))
    err = info.value.inner_exception
    assert isinstance(err, ed.UnsupportedOpError)
    assert err.op is aten.mm.default
    assert "aten.mm.default" in str(err) and "register_decomposition" in str(err)
    assert "fallthrough" not in str(err)  # a compiled graph has no native fallback to offer
    assert not backend.graphs


def test_decomposition_stuck_midway_is_named_as_in_eager():
    # silu -> sigmoid -> exp, and neither sigmoid nor exp is served: compile and eager
    # get stuck at the same place and say so with the same chain
    opset = ed.OpSet.coerce("core_aten") - ed.OpSet(["aten::sigmoid", "aten::exp"])
    x = torch.randn(4)
    with pytest.raises(ed.UnsupportedOpError) as eager:
        with ed.EagerDecompMode(opset):
            F.silu(x)
    backend = compile_backend(opset)
    with pytest.raises(BackendCompilerFailed) as info:
        torch.compile(F.silu, backend=backend)(x)
    err = info.value.inner_exception
    assert isinstance(err, ed.UnsupportedOpError)
    assert err.chain == eager.value.chain and aten.exp.default in err.chain
    assert err.op is aten.silu.default and "aten.exp.default" in str(err)


def test_same_table_as_the_mode():
    # a per-mode decomposition override reaches compiled graphs exactly as it reaches eager ones
    def hardswish_as_relu6(x):
        return x * torch.clamp(x + 3, 0, 6) / 6

    table = {aten.hardswish.default: hardswish_as_relu6}
    backend = compile_backend("core_aten", decompositions=table)
    x = torch.randn(16)
    with Witness() as rec, ed.EagerDecompMode("core_aten", decompositions=table):
        out = torch.compile(F.hardswish, backend=backend)(x)
    assert_same(out, F.hardswish(x))
    ops = backend.ops()
    assert aten.clamp.default in ops and aten.hardswish.default not in ops
    rec.assert_only("core_aten")


def test_prims_target_pointwise():
    backend = compile_backend("prims")
    rec, _ = _compiled_silu_grad_matches_eager(backend, "prims")
    assert backend.outside_opset() == [] and {g.kind for g in backend.graphs} == {"forward", "backward"}
    assert all(op.namespace == "prims" for op in backend.ops())
    rec.assert_only("prims")


def test_registered_name_after_import():
    # a fresh interpreter: the name must resolve after nothing but `import eagerdecomp`
    code = textwrap.dedent(
        """
        import torch, eagerdecomp
        f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2, backend="eagerdecomp")
        x = torch.randn(5)
        assert torch.allclose(f(x), torch.nn.functional.silu(x) * 2)
        from eagerdecomp.dynamo.backend import default_backend
        b = default_backend()
        assert len(b.graphs) == 1 and b.outside_opset() == [], b
        assert torch.ops.aten.silu.default not in b.ops()
        print("ok")
        """
    )
    env = dict(os.environ, TORCHDYNAMO_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        "torch.compile(backend='eagerdecomp') failed in a fresh interpreter. The name is registered by the "
        "torch_dynamo_backends entry point in pyproject.toml "
        '(eagerdecomp = "eagerdecomp.dynamo.backend:dynamo_backend"); '
        "if it is declared, reinstall the package (make install). stderr:\n" + proc.stderr[-3000:]
    )


def test_training_on_the_reference_device_with_the_switch():
    # No mode at all: the device switch decomposes the eager regions, the backend lowers the
    # graphs into exactly the ops the device has kernels for.
    from eagerdecomp.device import refdev

    if isinstance(REF_DEV_ERROR, BackendError):  # no C++ compiler here
        pytest.skip(f"reference device unavailable: {REF_DEV_ERROR}")
    if REF_DEV_ERROR is not None:
        raise REF_DEV_ERROR
    dev = REF_DEV
    device_switch.disable(dev)
    switch = device_switch.enable(dev)
    try:
        torch.manual_seed(0)
        native = TinyNet()
        model = copy.deepcopy(native).to(dev)
        xs, ys = [torch.randn(6, 8)], [torch.randint(0, 4, (6,))]
        backend = compile_backend(switch.runtime.opset)
        with refdev.op_log() as ran:
            losses = train_steps(
                model, [x.to(dev) for x in xs], [y.to(dev) for y in ys], torch.compile(model, backend=backend)
            )
        report = switch.report()
    finally:
        device_switch.disable(dev)
    expected = train_steps(native, xs, ys)

    for a, b in zip(losses, expected):
        assert a.device.type == dev.type
        assert_same(a.cpu(), b)
    for p, q in zip(model.parameters(), native.parameters()):
        assert_same(p.detach().cpu(), q.detach())
        assert_same(p.grad.cpu(), q.grad)
    for a, b in zip(model.buffers(), native.buffers()):
        assert_same(a.cpu(), b)
    kinds = graph_kinds(backend)
    assert kinds.count("forward") >= 3 and kinds.count("backward") >= 3, kinds
    assert backend.outside_opset() == []
    compiled_ops = {str(op) for op in backend.ops()}
    # the compiled graphs ran on the device's own kernels, none through the switch ...
    assert {op.removeprefix("aten.").removesuffix(".default") for op in compiled_ops} <= set(ran)
    assert not compiled_ops & {row.op for row in report.rows}
    # ... while the eager regions (the disabled tail, its backward, AdamW) went through it
    decomposed = {row.op for row in report.decomposed}
    assert {"aten.hardswish.default", "aten.hardswish_backward.default"} <= decomposed, decomposed


def test_register_by_hand():
    from eagerdecomp.dynamo.backend import default_backend, register

    register()
    register()  # idempotent
    before = len(default_backend().graphs)
    x = torch.randn(3, 4)
    out = torch.compile(lambda t: F.softplus(t) * 3, backend="eagerdecomp")(x)
    assert_same(out, F.softplus(x) * 3)
    assert len(default_backend().graphs) == before + 1
    assert aten.softplus.default not in default_backend().graphs[-1].ops()
