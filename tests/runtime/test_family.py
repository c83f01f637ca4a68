"""Shape families: one shape-generic kernel per op and family, eager-exact at every shape
its guard admits (eagerdecomp.family, eagerdecomp.symbolic, trace.trace_family)."""

import threading

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.decompositions.table import default_table
from eagerdecomp.runtime.cache import KernelCache
from eagerdecomp.runtime.core import Runtime
from eagerdecomp.runtime.family import MAX_MEMBERS
from eagerdecomp.testing import RecordingMode

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten

# decomposed under core_aten; each is called on (n, 6) inputs of many lengths n
CASES = {
    "mish": lambda x: F.mish(x),
    "silu": lambda x: F.silu(x),
    "hardswish": lambda x: F.hardswish(x),
    "softplus": lambda x: F.softplus(x, beta=2.0),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "std": lambda x: torch.std(x, 0),
    "t": lambda x: x.t(),
    "t_mm": lambda x: x.t() @ x,
    "addcmul_": lambda x: x.clone().addcmul_(x, x, value=0.3),
    "lerp": lambda x: torch.lerp(x, x * 2, 0.3),
    "roll": lambda x: torch.roll(x, 1, 0),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "cross_entropy": lambda x: F.cross_entropy(x, (x[:, 0] > 0).long()),
    "tril": lambda x: torch.tril(x),
    "triu_": lambda x: x.clone().triu_(),
    "masked_fill": lambda x: x.masked_fill(x > 0.5, -1e9),
    "mse": lambda x: F.mse_loss(x, x * 0.5),
    "chunk": lambda x: torch.chunk(x, 2, 1),
    "transposed_in": lambda x: F.silu(x.t()),
    "channels_last": lambda x: F.hardswish(
        x.reshape(1, 1, x.shape[0], 6).contiguous(memory_format=torch.channels_last)
    ),
}
LENGTHS = [5, 7, 2, 9, 12, 16, 3, 33]


def _assert_same(got, ref):
    if isinstance(ref, (tuple, list)):
        assert type(got) is type(ref) and len(got) == len(ref)
        for g, r in zip(got, ref):
            _assert_same(g, r)
        return
    assert (got.dtype, got.shape, got.device) == (ref.dtype, ref.shape, ref.device)
    assert all(n <= 1 or a == b for n, a, b in zip(ref.shape, got.stride(), ref.stride())), (got.stride(), ref.stride())
    assert got.storage_offset() == ref.storage_offset()
    torch.testing.assert_close(got, ref, equal_nan=True)


@pytest.fixture
def fresh():
    """A runtime over its own empty cache, used through a mode-like callable."""
    ed.cache_clear()
    yield
    ed.cache_clear()


@pytest.mark.parametrize("name", list(CASES))
def test_many_lengths_match_native_with_at_most_two_traces(name, fresh):
    fn = CASES[name]
    torch.manual_seed(0)
    with ed.EagerDecompMode("core_aten") as mode:
        for n in LENGTHS:
            x = torch.randn(n, 6)
            got = fn(x)
            with _Paused(mode):
                ref = fn(x)
            _assert_same(got, ref)
    report = mode.report()
    for row in report.decomposed:
        assert row.traces <= 2, f"{row.op}: {row.traces} traces over {len(LENGTHS)} lengths ({row.exact_shapes})"
    assert any(row.family for row in report.decomposed), str(report)


class _Paused:
    """Leave the mode for a native run inside its ``with`` block."""

    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.mode.__exit__(None, None, None)

    def __exit__(self, *exc):
        self.mode.__enter__()
        return False


def test_zero_one_specialization_traces_its_own_member(fresh):
    with ed.EagerDecompMode("core_aten") as mode:
        outs = [(x, F.mish(x)) for x in (torch.randn(4, 3), torch.randn(1, 3), torch.randn(6, 3), torch.randn(1, 3))]
    for x, y in outs:
        torch.testing.assert_close(y, F.mish(x))
    row = mode.report().row(aten.mish.default)
    assert row.traces == 2 and row.family == 1  # size 1 is its own member; 6 replays the 4's


def test_guard_failure_traces_another_member(fresh):
    # split's output count is decided on the size: each member admits the lengths with one count
    with ed.EagerDecompMode("core_aten") as mode:
        outs = [(n, torch.split(torch.randn(n, 3), 2, 0)) for n in (4, 3, 6, 5, 4)]
    for n, got in outs:
        assert [g.shape[0] for g in got] == [2] * (n // 2) + [1] * (n % 2)
    row = mode.report().row(aten.split.Tensor)
    assert row.traces == 2 and row.family == 2  # 3 replays the 4's member, 5 the 6's; the last 4 is an exact hit


def test_expanded_input_of_a_mutating_op_keeps_exact_kernels_with_a_reason(fresh):
    with ed.EagerDecompMode("core_aten") as mode:
        outs = []
        for n in (4, 5):
            y = torch.randn(n, 8)
            outs.append((y.clone(), aten.addcmul_.default(y, torch.randn(1, 8).expand(n, 8), y, value=0.5), y))
    for _before, out, y in outs:
        assert out is y
    row = mode.report().row(aten.addcmul_.default)
    assert row.traces == 2 and row.family == 0
    assert any("expanded" in why for why in row.exact_shapes)
    assert "exact shapes: " in str(mode.report())


def test_expanded_input_of_a_functional_op_shares_a_kernel(fresh):
    with ed.EagerDecompMode("core_aten") as mode:
        xs = [torch.randn(1, 8).expand(n, 8) for n in (4, 5, 9)]
        ys = [F.mish(x) for x in xs]
    for x, y in zip(xs, ys):
        _assert_same(y, F.mish(x))
    row = mode.report().row(aten.mish.default)
    assert row.traces == 1 and row.family == 2


@pytest.mark.parametrize("view", ["step slice", "last column", "offset rows", "transposed slice"])
def test_strided_and_offset_inputs_share_a_kernel(fresh, view):
    take = {
        "step slice": lambda x: x[:, ::2],
        "last column": lambda x: x[:, -1],
        "offset rows": lambda x: x[2:],
        "transposed slice": lambda x: x[1:].t(),
    }[view]
    with ed.EagerDecompMode("core_aten") as mode:
        pairs = []
        for n in (6, 9, 13, 7, 20):
            base = torch.randn(n, n + 3)
            x = take(base)
            pairs.append((x, F.mish(x), torch.logsumexp(x, 0), x.t()))
    for x, y, z, v in pairs:
        _assert_same(y, F.mish(x))
        _assert_same(z, torch.logsumexp(x, 0))
        assert v.stride() == x.t().stride() and v.storage_offset() == x.storage_offset()
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    row = mode.report().row(aten.mish.default)
    assert row.traces <= 2 and row.family >= 3, (row.traces, row.exact_shapes)


def test_scalar_views_at_any_offset_share_a_kernel(fresh):
    # x[i] += y[j] in a Python loop: 0-dim views whose storage offset changes every call
    # (ShapeEnv keeps a 0-dim tensor's offset static; each offset was a kernel of its own)
    x, y = torch.zeros(50), torch.rand(50)
    want = x.clone()
    for i in range(2, 40, 3):
        want[i] += y[i + 1]
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        for i in range(2, 40, 3):
            x[i] += y[i + 1]
    rec.assert_only("core_aten")
    assert torch.equal(x, want)
    row = mode.report().row(aten.add_.Tensor)
    assert row.traces <= 2 and row.family >= 10, (row.traces, row.family, row.exact_shapes)


def test_inplace_returns_its_input_and_views_alias_at_every_shape(fresh):
    with ed.EagerDecompMode("core_aten"):
        for n in (3, 5, 8):
            x = torch.randn(n, 4)
            y = x.clone()
            out = aten.hardswish_.default(y)
            assert out is y
            torch.testing.assert_close(y, F.hardswish(x))
            v = x.t()
            assert v._base is x or v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert v.stride() == (1, 4)


def test_lifted_floats_and_shapes_share_one_kernel(fresh):
    with ed.EagerDecompMode("core_aten") as mode:
        for n, beta in [(3, 1.5), (5, 2.5), (9, 3.5), (4, 1.25)]:
            x = torch.randn(n, 2)
            torch.testing.assert_close(F.softplus(x, beta=beta), F.softplus(x, beta=beta))
    row = mode.report().row(aten.softplus.default)
    assert row.traces == 1


def test_only_opset_ops_reach_the_kernels_on_a_family_replay(fresh):
    with ed.EagerDecompMode("core_aten"):
        F.mish(torch.randn(3, 5))
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        F.mish(torch.randn(8, 5))
    rec.assert_only("core_aten")
    assert mode.report().row(aten.mish.default).family == 1


def test_family_switch_off(fresh, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_SHAPE_GENERIC", "0")
    with ed.EagerDecompMode("core_aten") as mode:
        for n in (3, 4, 5):
            F.mish(torch.randn(n))
    row = mode.report().row(aten.mish.default)
    assert row.traces == 3 and row.family == 0


def test_members_are_bounded(fresh):
    # split's output count depends on the size: every length is its own member, until
    # the family is given up for exact-shape kernels
    with ed.EagerDecompMode("core_aten") as mode:
        for n in range(2, 2 * MAX_MEMBERS + 8):
            x = torch.randn(n, 3)
            got = torch.split(x, 2, 0)
            assert [g.shape for g in got] == [r.shape for r in x.split(2, 0)]
    row = mode.report().row(aten.split.Tensor)
    assert any("specializations" in why for why in row.exact_shapes)
    assert mode.runtime.cache.info().members <= MAX_MEMBERS


def test_threads_share_a_family_and_match_native():
    opset = ed.OpSet.preset("core_aten")
    runtime = Runtime(opset, default_table(opset), KernelCache())
    errors = []
    barrier = threading.Barrier(4)

    def work(k):
        try:
            barrier.wait()
            for n in range(2 + k, 40, 3):
                x = torch.randn(n, 5)
                y = runtime(aten.mish.default, (x,), {})
                torch.testing.assert_close(y, F.mish(x))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    info = runtime.cache.info()
    assert info.members <= 2 and info.family_hits > 0


def test_failed_member_trace_leaves_the_family_untouched():
    calls = []

    def flaky(x):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt("interrupted mid-trace")
        return x * torch.tanh(F.softplus(x))

    mode = ed.EagerDecompMode("core_aten", decompositions={aten.mish.default: flaky})
    with pytest.raises(KeyboardInterrupt), mode:
        aten.mish.default(torch.randn(5))
    cache = mode.runtime.cache
    assert len(cache) == 0 and not cache._family_flights and cache.info().members == 0
    with mode:
        for n in (5, 6, 7):
            x = torch.randn(n)
            torch.testing.assert_close(aten.mish.default(x), F.mish(x))
    assert mode.report().row(aten.mish.default).traces == 1  # one member serves the three lengths


def test_size_arguments_are_symbols_too(fresh):
    # SymInt arguments (a view's size, a factory's size, arange's bound) are symbols of the
    # family: one kernel serves every length; 0/1 and negative sizes stay values
    with ed.EagerDecompMode("core_aten") as mode:
        outs = []
        for n in (5, 7, 12, 3):
            x = torch.randn(n, 6)
            outs.append(
                (
                    n,
                    x,
                    aten._unsafe_view.default(x, [n * 2, 3]),
                    torch.zeros(n, 4),
                    torch.arange(n),
                    aten._unsafe_view.default(x, [-1, 2]),
                )
            )
    for n, x, v, z, a, w in outs:
        torch.testing.assert_close(v, x.reshape(n * 2, 3))
        assert z.shape == (n, 4) and z.dtype == torch.float32 and not z.any()
        assert torch.equal(a, torch.arange(n))
        torch.testing.assert_close(w, x.reshape(-1, 2))
    report = mode.report()
    for op in (aten._unsafe_view.default, aten.zeros.default, aten.arange.default):
        row = report.row(op)
        assert row.traces <= 2 and row.family >= 2, (op, row.traces, row.family, row.exact_shapes)


def test_in_place_view_ops_keep_exact_shape_kernels():
    # squeeze_ of a dim that is not 1, traced over fakes with a ShapeEnv, segfaults torch 2.13
    mode = ed.EagerDecompMode("core_aten")
    for d in (1, -1, 2):
        x = torch.empty_strided((5, 1, 5, 1), (5, 5, 1, 1)).normal_()
        want = x.clone().squeeze_(d)
        with mode:
            out = x.squeeze_(d)
        assert out is x and (x.shape, x.stride()) == (want.shape, want.stride())
    row = mode.report().row(torch.ops.aten.squeeze_.dim)
    assert any("in-place view" in r for r in row.exact_shapes), row


def test_a_family_trace_never_walks_the_python_stack(fresh, monkeypatch):
    # ShapeEnv names the user's line for each symbol and guard it makes by walking the stack
    # (and, the first time, importing torch.export and Inductor to skip their frames): our
    # guards are read by no one else, so the walk is only cost
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    def walked(self):
        raise AssertionError("a family trace walked the Python stack")

    monkeypatch.setattr(ShapeEnv, "_get_user_frame", walked)
    with ed.EagerDecompMode("core_aten") as mode:
        outs = [(x, F.mish(x), torch.split(x, 2, 0)) for x in (torch.randn(4, 3), torch.randn(6, 3))]
    for x, y, parts in outs:
        torch.testing.assert_close(y, F.mish(x))
        assert [p.shape[0] for p in parts] == [2] * (x.shape[0] // 2)
    assert mode.report().row(aten.mish.default).family == 1
