"""compile=: hot kernels handed to a graph compiler, never at the cost of exactness."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
import eagerdecomp.runtime.compiler as compiled
from eagerdecomp.errors import BackendError, UnsupportedArgumentError
from eagerdecomp.runtime import hits
from eagerdecomp.testing import RecordingMode

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten


class Counting:
    """A graph compiler that runs the graph as it is, and remembers what it was given."""

    def __init__(self, wrong=False, fail=False):
        self.graphs, self.wrong, self.fail = [], wrong, fail
        self.__name__ = "counting"

    def __call__(self, gm, example_inputs):
        if self.fail:
            raise RuntimeError("no kernel for this graph")
        self.graphs.append(gm)
        if self.wrong:
            return lambda *a: [o + 1 for o in gm.forward(*a)]
        return gm.forward


@pytest.fixture(autouse=True)
def fresh():
    ed.cache_clear()
    yield
    ed.cache_clear()


def _calls(mode, fn, n):
    with mode:
        return [fn() for _ in range(n)][-1]


def test_a_hot_kernel_is_compiled_once_and_answers_later_calls():
    c = Counting()
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    got = _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 5)
    row = mode.report().row(aten.logaddexp.default)
    assert len(c.graphs) == 1
    assert row.compiled == 3 and row.hits == compiled.AFTER + 4  # compiled calls are hits too
    with ed.EagerDecompMode("core_aten"):
        replayed = torch.logaddexp(x, y)
    assert torch.equal(got, replayed)  # the compiler here runs the graph as it is
    assert "compiled x3" in str(mode.report())


def test_only_opset_ops_reach_below_a_compiled_kernel():
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=Counting())
    _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 2)
    with RecordingMode() as rec, mode:
        torch.logaddexp(x, y)
    assert mode.report().row(aten.logaddexp.default).compiled == 1
    assert rec.outside("core_aten") == []


def test_a_key_seen_less_often_than_the_policy_never_compiles():
    c = Counting()
    mode = ed.EagerDecompMode("core_aten", compile=c)
    with mode:
        for n in range(1, 8):  # a new shape every call: dynamic padding
            torch.logaddexp(torch.randn(n), torch.randn(n))
    assert c.graphs == []


@pytest.mark.parametrize(
    "fn, reason",
    [
        (lambda x: torch.nn.functional.silu(x), "replay is as fast at this size"),  # 2 ops on 64 elements
        (lambda x: x.t(), "one op: nothing to fuse"),
        (lambda x: torch.nn.functional.dropout(x, 0.5, training=True), "draws random numbers"),
    ],
)
def test_kernels_that_cannot_gain_or_cannot_be_exact_stay_on_replay(fn, reason):
    c = Counting()
    x = torch.randn(8, 8)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    _calls(mode, lambda: fn(x), compiled.AFTER + 3)
    rows = [r for r in mode.report().rows if r.not_compiled]
    assert c.graphs == [] and rows and any(reason in why for r in rows for why in r.not_compiled), mode.report()


def test_a_long_graph_on_large_tensors_qualifies():
    x = torch.randn(1 << 14)
    c = Counting()
    mode = ed.EagerDecompMode("core_aten", compile=c)
    _calls(mode, lambda: torch.nn.functional.silu(x), compiled.AFTER + 3)
    assert len(c.graphs) == 1  # 2 ops, but a memory pass saved on 16K elements


def test_in_place_keeps_identity_writes_and_eagers_overlap_error():
    c = Counting()
    y = torch.randn(1 << 14)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    xs = [torch.randn(1 << 14) for _ in range(compiled.AFTER + 3)]
    with mode:
        outs = [x.add_(y, alpha=2) for x in xs]
    assert len(c.graphs) == 1 and mode.report().row(aten.add_.Tensor).compiled == 1
    assert outs[-1] is xs[-1]
    x = torch.randn(1 << 14)
    want = x + 2 * y
    with mode:
        assert x.add_(y, alpha=2) is x
    torch.testing.assert_close(x, want)
    # eager's overlap rule still runs before the compiled code: an input overlapping the output
    base = torch.randn(1 << 14 + 1)
    with pytest.raises(RuntimeError) as native:
        base[1:].add_(base[:-1])
    with mode, pytest.raises(RuntimeError) as ours:
        base[1:].add_(base[:-1], alpha=1)
    assert str(native.value).split(".")[0] in str(ours.value)


def test_lifted_floats_are_compiled_per_value():
    c = Counting()
    x, y, z = torch.randn(64), torch.randn(64), torch.rand(64) + 0.5
    mode = ed.EagerDecompMode("core_aten", compile=c)
    _calls(mode, lambda: torch.addcdiv(x, y, z, value=0.3), compiled.AFTER + 3)
    got = _calls(mode, lambda: torch.addcdiv(x, y, z, value=0.2), compiled.AFTER + 3)
    torch.testing.assert_close(got, torch.addcdiv(x, y, z, value=0.2))
    assert len(c.graphs) == 2


class Spy(Counting):
    """Counting, whose compiled code also counts its calls."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def __call__(self, gm, example_inputs):
        fn = super().__call__(gm, example_inputs)

        def run(*a):
            self.runs += 1
            return fn(*a)

        return run


def _python_lookups(mode, monkeypatch) -> list:
    """Calls that reached the compiler's Python lookup (the Python path), recorded."""
    seen, lookup = [], mode.runtime.compiler.lookup
    monkeypatch.setattr(mode.runtime.compiler, "lookup", lambda key, *a: seen.append(key) or lookup(key, *a))
    return seen


def _reference_device():
    """edref, or a skip where the C++ library is not built (EAGERDECOMP_NO_EXT=1)."""
    from eagerdecomp.device.refdev import reference_device

    try:
        return reference_device()
    except BackendError as e:
        pytest.skip(str(e))


needs_cpp = pytest.mark.skipif(not hits.enabled(), reason="the C++ hit path is not built")


@needs_cpp
def test_compiled_and_declined_keys_are_served_by_the_cpp_table(monkeypatch):
    c = Spy()
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 2)  # compiled on the last (which replays)
    _calls(mode, lambda: x.t(), compiled.AFTER + 2)  # declined: a view
    seen = _python_lookups(mode, monkeypatch)
    runs = c.runs
    got = _calls(mode, lambda: torch.logaddexp(x, y), 5)
    assert _calls(mode, lambda: x.t(), 5)._base is x
    assert seen == [] and c.runs == runs + 5  # keyed, found and run from C++, no Python lookup
    torch.testing.assert_close(got, torch.logaddexp(x, y))
    row = mode.report().row(aten.logaddexp.default)
    assert row.compiled == 5 and row.cpp_hits == 0  # compiled hits are reported as compiled
    assert mode.report().row(aten.t.default).cpp_hits == 5


@needs_cpp
def test_compiled_code_is_found_by_value_behind_a_lifted_float(monkeypatch):
    c = Spy()
    x, y, z = torch.randn(64), torch.randn(64), torch.rand(64) + 0.5
    mode = ed.EagerDecompMode("core_aten", compile=c)
    for w in (0.3, 0.2):
        _calls(mode, lambda: torch.addcdiv(x, y, z, value=w), compiled.AFTER + 2)
    seen = _python_lookups(mode, monkeypatch)
    runs = c.runs
    for w in (0.3, 0.2):
        want = torch.addcdiv(x, y, z, value=w)
        torch.testing.assert_close(_calls(mode, lambda: torch.addcdiv(x, y, z, value=w), 3), want)
    assert seen == [] and c.runs == runs + 6 and len(c.graphs) == 2
    # a value never compiled (the C++ key has the float's class only): back to Python, replayed
    want = torch.addcdiv(x, y, z, value=0.4)
    torch.testing.assert_close(_calls(mode, lambda: torch.addcdiv(x, y, z, value=0.4), 1), want)
    assert len(seen) == 1 and c.runs == runs + 6


@needs_cpp
def test_floats_that_change_every_call_replay_from_cpp(monkeypatch):
    # an optimizer's per-step factors: compiled code is per value, and these never repeat
    c = Spy()
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    with mode:
        for i in range(compiled.VARYING + 2):
            torch.lerp(x, y, 0.1 + 0.01 * i)
    seen = _python_lookups(mode, monkeypatch)
    with mode:
        got = torch.lerp(x, y, 0.42)
    assert seen == [] and c.graphs == []  # replayed from C++: no Python, nothing compiled
    torch.testing.assert_close(got, torch.lerp(x, y, 0.42))
    row = mode.report().row(aten.lerp.Scalar)
    assert row.cpp_hits == 1 and any(
        f"took over {compiled.VARYING} values, none compiled" in r for r in row.not_compiled
    )


@needs_cpp
def test_a_key_the_compiler_failed_on_replays_from_cpp():
    # inference tensors carry no version counter, which a fused write sets: Inductor's code is
    # refused for them, and the key's later calls replay in C++ like any key left on replay
    n = compiled.MIN_NUMEL
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with torch.inference_mode(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = torch.randn(n)
        for _ in range(compiled.AFTER + 4):
            x = torch.randn(n)
            want = x + y
            with mode:
                assert x.add_(y) is x
            torch.testing.assert_close(x, want)
    row = mode.report().row(aten.add_.Tensor)
    assert row.compiled == 0 and row.cpp_hits == 2 and any("version counter" in r for r in row.not_compiled)
    assert sum("stays on replay" in str(m.message) for m in w) == 1


def test_threads_compile_one_at_a_time_and_agree_with_eager():
    # Inductor's compiler is not thread-safe: compiles never overlap; a thread that finds one
    # running replays and tries again on a later call
    import threading
    import time

    class Slow(Counting):
        def __init__(self):
            super().__init__()
            self.active = self.overlaps = 0

        def __call__(self, gm, example_inputs):
            self.active += 1
            self.overlaps += self.active > 1
            time.sleep(0.05)  # wide enough for the other threads to arrive
            try:
                return super().__call__(gm, example_inputs)
            finally:
                self.active -= 1

    c = Slow()
    mode = ed.EagerDecompMode("core_aten", compile=c)
    bad, start = [], threading.Barrier(4)

    def work(n):
        x, y = torch.randn(n), torch.randn(n)
        start.wait()
        deadline = time.monotonic() + 60  # (a bound for a hang, not a timing)
        while len(c.graphs) < 4 and time.monotonic() < deadline:
            with mode:
                got = torch.logaddexp(x, y)
            if not torch.allclose(got, torch.logaddexp(x, y)):
                bad.append(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in (60, 61, 62, 63)]  # a key each
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and c.overlaps == 0 and len(c.graphs) == 4


def test_a_mode_without_compile_never_runs_compiled_code():
    c = Spy()
    x, y = torch.randn(64), torch.randn(64)
    _calls(ed.EagerDecompMode("core_aten", compile=c), lambda: torch.logaddexp(x, y), compiled.AFTER + 3)
    runs = c.runs
    plain = ed.EagerDecompMode("core_aten")  # the same kernel cache: its hits replay
    _calls(plain, lambda: torch.logaddexp(x, y), 3)
    assert c.runs == runs > 0 and plain.report().row(aten.logaddexp.default).compiled == 0


def test_a_failing_compiler_warns_once_per_op_and_replay_answers():
    c = Counting(fail=True)
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 4)
        _calls(mode, lambda: torch.logaddexp(x[:32], y[:32]), compiled.AFTER + 4)
    mine = [str(m.message) for m in w if "stays on replay" in str(m.message)]
    assert len(mine) == 1 and "counting failed: RuntimeError: no kernel for this graph" in mine[0]
    torch.testing.assert_close(got, torch.logaddexp(x, y))
    assert mode.report().row(aten.logaddexp.default).compiled == 0


def test_a_compiler_that_changes_values_is_refused():
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=Counting(wrong=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 4)
    torch.testing.assert_close(got, torch.logaddexp(x, y))
    row = mode.report().row(aten.logaddexp.default)
    assert row.compiled == 0 and any("values differ from replay" in r for r in row.not_compiled)


def test_cache_clear_forgets_compiled_kernels():
    c = Counting()
    x, y = torch.randn(64), torch.randn(64)
    mode = ed.EagerDecompMode("core_aten", compile=c)
    _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 2)
    ed.cache_clear()
    _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 2)
    assert len(c.graphs) == 2


def test_bad_compile_arguments_are_refused(monkeypatch):
    from torch._inductor.codegen import common

    with pytest.raises(UnsupportedArgumentError, match="compile must be None, 'inductor' or a callable"):
        ed.EagerDecompMode("core_aten", compile="tvm")
    _reference_device()
    # a device that offers Inductor no code generators (edref offers CPU's: its memory is host memory)
    monkeypatch.delitem(common.device_codegens, "edref", raising=False)
    monkeypatch.setattr(torch.edref, "__getattr__", lambda name: None)
    with pytest.raises(BackendError, match="Inductor generates no code for this device"):
        ed.enable("edref", compile="inductor")


def test_device_switch_compiles_with_the_device_teams_compiler():
    _reference_device()
    c = Counting()
    backend = ed.enable("edref", compile=c)
    try:
        x, y = torch.randn(64), torch.randn(64)
        xd, yd = x.to("edref"), y.to("edref")
        for _ in range(compiled.AFTER + 3):
            got = torch.logaddexp(xd, yd)
        assert len(c.graphs) == 1 and backend.report().row(aten.logaddexp.default).compiled == 1
        torch.testing.assert_close(got.cpu(), torch.logaddexp(x, y))
    finally:
        ed.disable("edref")


def test_inductor_fused_kernel_matches_eager():
    x, y = torch.randn(4, 64), torch.randn(4, 64).t().contiguous().t()  # a strided input
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    got = _calls(mode, lambda: torch.nn.functional.huber_loss(x, y, reduction="none"), compiled.AFTER + 3)
    want = torch.nn.functional.huber_loss(x, y, reduction="none")
    assert mode.report().row(aten.huber_loss.default).compiled == 1, mode.report()
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want)


def test_inductor_code_serves_only_the_layout_it_was_compiled_for():
    # the code is compiled without Inductor's size asserts: the exact key (sizes, strides,
    # offset) is what keeps a call from reaching code compiled for another layout
    n = 128
    big, flat = torch.randn(n, 2 * n), torch.randn(n * n + 1)
    layouts = {
        "contiguous": lambda: torch.randn(n, n),
        "every other column": lambda: big[:, ::2],
        "offset by one": lambda: flat[1:].view(n, n),
        "transposed": lambda: torch.randn(n, n).t(),
    }
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    for name, make in layouts.items():
        x, y = make(), torch.randn(n, n)
        with mode:
            for _ in range(compiled.AFTER + 3):
                got = F.huber_loss(x, y, reduction="none")
        want = F.huber_loss(x, y, reduction="none")
        assert (got.shape, got.stride()) == (want.shape, want.stride()), name
        torch.testing.assert_close(got, want, msg=name)
    assert mode.report().row(aten.huber_loss.default).compiled == len(layouts), mode.report()


_SECOND = """
import torch, eagerdecomp as ed
from torch._dynamo.utils import counters
x, y = torch.randn(256), torch.randn(256)
m = ed.EagerDecompMode("core_aten", compile="inductor")
with m:
    for _ in range(6):
        torch.logaddexp(x, y)
assert m.report().row(torch.ops.aten.logaddexp.default).compiled
print(counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


def test_compiled_code_is_cached_on_disk_for_the_next_process(tmp_path):
    env = dict(os.environ, EAGERDECOMP_CACHE_DIR=str(tmp_path), EAGERDECOMP_DISK_CACHE="1")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)

    def run():
        out = subprocess.run([sys.executable, "-c", _SECOND], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return tuple(map(int, out.stdout.split()[-2:]))

    assert run() == (0, 1)  # compiled, and written under EAGERDECOMP_CACHE_DIR
    assert (tmp_path / "inductor").is_dir()
    assert run() == (1, 0)  # the next process loads it


def test_an_in_place_foreach_returning_nothing_stays_on_replay():
    xs, ys = [torch.randn(1 << 14) for _ in range(2)], [torch.randn(1 << 14) for _ in range(2)]
    want = [x + 0.5 * y for x, y in zip(xs, ys)]
    mode = ed.EagerDecompMode("core_aten", compile=Counting())
    with mode:
        for _ in range(compiled.AFTER + 3):
            torch._foreach_add_(xs, ys, alpha=0.5)
    row = mode.report().row(aten._foreach_add_.List)
    assert row.compiled == 0 and row.not_compiled == ["returns a constant (None)"]
    torch.testing.assert_close(xs, [w + (compiled.AFTER + 2) * 0.5 * y for w, y in zip(want, ys)])


def _fused_entries():
    return [v for c in compiled._COMPILERS.values() for v in c._table.values() if type(v) is compiled.Compiled]


def test_inductor_writes_in_place_in_the_fused_kernel_as_eager_would():
    # the final copy_ into self stays in the graph Inductor compiles: one pass, no copy after it
    n = compiled.MIN_NUMEL
    y, z = torch.randn(n), torch.randn(n)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for _ in range(compiled.AFTER + 2):
            torch.randn(n).addcmul_(y, z, value=0.5)
    (entry,) = _fused_entries()
    assert entry.plan.fused == (0,) and not entry.plan.writes
    x = torch.randn(n)
    want, version = x.clone().addcmul_(y, z, value=0.5), x._version
    with mode:
        out = x.addcmul_(y, z, value=0.5)
    assert out is x and x._version == version + 1  # eager's identity and version count
    torch.testing.assert_close(x, want)
    # self sharing memory with another input: this call replays (the code assumes no sharing)
    base = torch.randn(2 * n)
    want = base.clone()
    with ed.EagerDecompMode("core_aten"):  # replay's answer, bit for bit
        want[:n].addcmul_(want[n:], z, value=0.5)
    with mode:
        base[:n].addcmul_(base[n:], z, value=0.5)
    torch.testing.assert_close(base, want, rtol=0, atol=0)


@needs_cpp
def test_a_direct_program_keeps_identity_versions_and_replays_on_shared_memory(monkeypatch):
    # Inductor's code called from C++ (Compiled.direct): what Compiled.flat does runs there
    runs, direct = [], compiled._direct

    def counted(wrapped, inner, gm):  # Inductor's code, counting its calls
        inner[:] = [(g, lambda args, code=code: runs.append(1) or code(args)) for g, code in inner]
        return direct(wrapped, inner, gm)

    monkeypatch.setattr(compiled, "_direct", counted)
    n = compiled.MIN_NUMEL
    y = torch.randn(n)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for _ in range(compiled.AFTER + 2):
            torch.randn(n).add_(y)
    (entry,) = _fused_entries()
    assert entry.direct() is not None
    runs.clear()
    flats = []
    monkeypatch.setattr(compiled.Compiled, "flat", lambda self, inputs: flats.append(inputs))
    x = torch.randn(n)
    want, version = x + y, x._version
    with mode:
        out = x.add_(y)
    assert out is x and x._version == version + 1
    torch.testing.assert_close(x, want)
    a = torch.randn(n)
    want = a + a
    with mode:
        a.add_(a.view(n))  # the same key, self sharing memory with the other input: the steps run
    torch.testing.assert_close(a, want, rtol=0, atol=0)
    assert len(runs) == 1
    w = torch.randn(n, requires_grad=True)
    loss = (w * x).sum()  # x is saved for backward: the write must show in its version
    with mode:
        x.add_(y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    assert flats == [] and len(runs) == 2 and mode.report().row(aten.add_.Tensor).compiled == 3


def test_only_opset_ops_reach_below_inductors_code():
    x, y = torch.randn(compiled.MIN_NUMEL), torch.randn(compiled.MIN_NUMEL)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    _calls(mode, lambda: torch.logaddexp(x, y), compiled.AFTER + 2)
    with RecordingMode() as rec, mode:
        got = torch.logaddexp(x, y)
    assert mode.report().row(aten.logaddexp.default).compiled == 1
    rec.assert_only("core_aten")
    torch.testing.assert_close(got, torch.logaddexp(x, y))


@needs_cpp
def test_inductor_code_behind_a_lifted_float_is_called_directly_per_value(monkeypatch):
    n = compiled.MIN_NUMEL
    y = torch.randn(n)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for w in (0.3, 0.2):
            for _ in range(compiled.AFTER + 2):
                torch.randn(n).lerp_(y, w)
    flats = []
    flat = compiled.Compiled.flat
    monkeypatch.setattr(compiled.Compiled, "flat", lambda self, inputs: flats.append(1) or flat(self, inputs))
    for w in (0.3, 0.2, 0.4):  # 0.4: never compiled, so Python answers (and counts) it
        x = torch.randn(n)
        want, version = x.clone().lerp_(y, w), x._version
        with mode:
            assert x.lerp_(y, w) is x
        torch.testing.assert_close(x, want)
        assert x._version == version + 1
    # 0.2 answered compiled once in Python (its first call after compiling), then 0.3 and 0.2 from C++
    assert flats == [] and mode.report().row(aten.lerp_.Scalar).compiled == 3


def test_a_fused_write_still_trips_autograds_in_place_check():
    n = compiled.MIN_NUMEL
    y = torch.randn(n)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for _ in range(compiled.AFTER + 2):
            torch.randn(n).add_(y, alpha=0.5)
    assert _fused_entries()
    w = torch.randn(n, requires_grad=True)
    x = torch.randn(n)
    loss = (w * x).sum()  # x is saved for backward
    with mode:
        x.add_(y, alpha=0.5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_fused_write_overlapping_another_input_raises_eagers_error():
    # the compiled key's offsets (1, 2) from distinct storages, then the same key sharing one
    n = compiled.MIN_NUMEL
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for _ in range(compiled.AFTER + 2):
            torch.randn(n + 2)[1 : n + 1].add_(torch.randn(n + 2)[2 : n + 2])
    assert _fused_entries()
    base = torch.randn(n + 2)
    with pytest.raises(RuntimeError) as native:
        base[1 : n + 1].add_(base[2 : n + 2])
    with mode, pytest.raises(RuntimeError) as ours:
        base[1 : n + 1].add_(base[2 : n + 2])
    assert str(native.value).split(".")[0] in str(ours.value)


def test_compiled_code_calling_ops_outside_the_opset_stays_on_replay():
    # Inductor runs addmm as an extern kernel, aten.addmm.out: not a core op, so not compiled
    n = 128
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.randn(n, n)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mode:
            for _ in range(compiled.AFTER + 2):  # replays, then the compile that is refused
                a.clone().addmm_(b, c)
        with RecordingMode() as rec, mode:
            out = a.clone().addmm_(b, c)
    row = mode.report().row(aten.addmm_.default)
    assert row.compiled == 0 and any("outside the opset" in r for r in row.not_compiled), row
    rec.assert_only("core_aten")
    torch.testing.assert_close(out, a.clone().addmm_(b, c))


def test_a_graph_with_an_unread_output_of_a_multi_output_op_compiles():
    # nanmedian's decomposition sorts and never reads sort's indices: their getitem has no users,
    # like a check, but reads a computed value (found by the compiled conformance run: KeyError)
    x = torch.randn(4, 64)
    x[0, 3] = float("nan")
    c = Counting()
    mode = ed.EagerDecompMode("core_aten", compile=c)
    got = _calls(mode, lambda: torch.nanmedian(x, 1), compiled.AFTER + 3)
    assert len(c.graphs) == 1 and mode.report().row(aten.nanmedian.dim).compiled == 1
    want = torch.nanmedian(x, 1)
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


def test_a_kernel_writing_through_computed_indices_stays_on_replay():
    # Inductor's code for this backward (index_put over clamped coordinates) corrupted the heap
    # on OpInfo's float64 samples, where replay is exact: such kernels are never compiled
    x = torch.randn(2, 3, 5, 20, dtype=torch.float64, requires_grad=True)
    grid = (torch.rand(2, 13, 10, 2, dtype=torch.float64) * 4 - 2).requires_grad_()
    c = Counting()
    mode = ed.EagerDecompMode("core_aten", compile=c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(compiled.AFTER + 3):
            with mode:
                got = torch.autograd.grad(F.grid_sample(x, grid, align_corners=False).sum(), [x, grid])
    row = mode.report().row(aten.grid_sampler_2d_backward.default)
    assert row.compiled == 0 and any("writes through computed indices" in r for r in row.not_compiled), row
    assert not any(n.target is aten.index_put.default for gm in c.graphs for n in gm.graph.nodes)
    want = torch.autograd.grad(F.grid_sample(x, grid, align_corners=False).sum(), [x, grid])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_inductor_with_a_repeated_input_matches_eager():
    x = torch.randn(1 << 14)
    mode = ed.EagerDecompMode("core_aten", compile="inductor")
    with mode:
        for _ in range(compiled.AFTER + 4):  # the last two answered compiled
            got = torch.logaddexp(x, x)
    assert mode.report().row(aten.logaddexp.default).compiled == 2
    torch.testing.assert_close(got, torch.logaddexp(x, x))


def test_inductor_code_is_called_directly_only_with_our_graphs_signature():
    def graph(fn):
        return torch.fx.symbolic_trace(fn)

    ours = graph(lambda a, b: [a + b])
    seen = []

    def code(args):  # Inductor's convention: one list of inputs
        seen.append(args)
        return [args[0] + args[1]]

    def wrapped(*args):
        return "AOTAutograd's callable"

    direct = compiled._direct(wrapped, [(graph(lambda a, b: [a * b]), code)], ours)
    x, y = torch.ones(2), torch.ones(2)
    assert torch.equal(direct(x, y)[0], x + y) and seen == [[x, y]]
    # AOTAutograd changed the signature (a deduped input, an extra output), or compiled twice
    assert compiled._direct(wrapped, [(graph(lambda a: [a]), code)], ours) is wrapped
    assert compiled._direct(wrapped, [(graph(lambda a, b: [a, b]), code)], ours) is wrapped
    assert compiled._direct(wrapped, [(ours, code), (ours, code)], ours) is wrapped
    assert compiled._direct(wrapped, [], ours) is wrapped
