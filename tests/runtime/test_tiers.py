"""Tiers (eagerdecomp.runtime.tiers): a key's first calls run its decomposition directly,
checked as a trace is; the next one traces; both give eager's results, bitwise alike.

The property test runs each case three times under one mode: twice direct (the key is
cold) and once from its traced kernel, and compares all three with native eager (values,
dtypes, shapes, strides, storage offsets, aliasing, the inputs after in-place writes) and
with each other bitwise; random ops draw from the same seed on each run.
"""

from __future__ import annotations

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.runtime.tiers import Tiers, trace_after
from eagerdecomp.testing import RecordingMode
from tests.compare import assert_like_eager
from tests.conformance.harness import copy_args

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    ed.cache_clear()
    yield
    ed.cache_clear()


def _layouts(shape, gen):
    """The same values in several layouts: contiguous, transposed, sliced at an offset,
    expanded (stride 0)."""
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    yield "contiguous", base.clone()
    yield "transposed", base.t().contiguous().t()
    big = torch.randn(shape[0] + 2, shape[1] * 2, generator=gen, dtype=torch.float64)
    yield "offset slice", big[1 : shape[0] + 1, ::2]
    yield "expanded", torch.randn(1, shape[1], generator=gen, dtype=torch.float64).expand(shape)


# (name, fn, whether it writes its first argument); fn takes (x, y) of one shape
CASES = {
    "gelu": (lambda x, y: torch.nn.functional.gelu(x), False),
    "log_softmax": (lambda x, y: torch.log_softmax(x, 1), False),
    "addcmul_": (lambda x, y: x.addcmul_(y, y, value=0.5), True),
    "lerp_": (lambda x, y: x.lerp_(y, 0.25), True),
    "hardswish": (lambda x, y: torch.nn.functional.hardswish(x), False),
    "smooth_l1": (lambda x, y: torch.nn.functional.smooth_l1_loss(x, y, reduction="none"), False),
    "var_mean": (lambda x, y: torch.var_mean(x, dim=0, correction=1), False),
    "logsumexp": (lambda x, y: torch.logsumexp(x, 1), False),
    "t": (lambda x, y: x.t(), False),
    "reshape": (lambda x, y: x.reshape(-1), False),
    "out=": (lambda x, y: torch.special.xlogy(x.abs(), y, out=torch.empty(0, dtype=x.dtype)), False),
    "dropout": (lambda x, y: torch.nn.functional.dropout(x, 0.3, training=True), False),
}
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _same_bits(p, q) -> bool:
    """The same tensor to the bit (NaNs included), layout included."""
    if not isinstance(p, torch.Tensor):
        return p == q
    if (p.dtype, p.shape, p.stride(), p.storage_offset()) != (q.dtype, q.shape, q.stride(), q.storage_offset()):
        return False
    if p.dtype in _BITS:
        return torch.equal(p.contiguous().view(_BITS[p.dtype]), q.contiguous().view(_BITS[q.dtype]))
    return torch.equal(p, q)


def _run(fn, x, y, seed):
    torch.manual_seed(seed)
    return fn(x, y)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_direct_and_traced_calls_agree_bitwise_and_with_eager(name, dtype, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    fn, writes = CASES[name]
    gen = torch.Generator().manual_seed(hash((name, str(dtype))) % 2**31)
    for layout, x in _layouts((5, 6), gen):
        if writes and layout == "expanded":
            continue  # eager refuses to write an expanded tensor in place (tested elsewhere)
        x = x.to(dtype)
        y = torch.randn(5, 6, generator=gen, dtype=dtype)
        seed = int(torch.randint(0, 2**31, (1,), generator=gen))
        ed.cache_clear()
        runs = []
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
            for _ in range(3):  # direct, direct, traced (TRACE_AFTER=2)
                args = copy_args((x, y))
                runs.append((_run(fn, *args, seed), args))
        rec.assert_only("core_aten")
        want_args = copy_args((x, y))
        want = _run(fn, *want_args, seed)
        for i, (got, args) in enumerate(runs):
            where = f"{name} {layout} {dtype}, call {i + 1}"
            try:
                assert_like_eager(want, got, exact=False, inputs=(list(want_args), list(args)))
                assert_like_eager(list(want_args), list(args), exact=False)
            except AssertionError as e:
                raise AssertionError(f"{where}: {e}") from None
        # the direct calls and the traced replay: the same opset ops, so the very same bits
        for (a, _), (b, _) in zip(runs, runs[1:]):
            for p, q in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
                assert _same_bits(p, q), f"{name} {layout} {dtype}: a direct call and the traced replay differ"
        routes = mode.report()
        decomposed = [r for r in routes.rows if r.direct or r.traces]
        direct = sum(r.direct for r in decomposed)
        if name == "out=":  # an out= op traces at its first call (runtime/direct.py: tiered)
            assert direct == 0, str(routes)
        elif decomposed:  # (t and reshape of some layouts are views eager's own kernels serve)
            assert direct >= 1 and sum(r.traces for r in decomposed) >= 1, str(routes)


def test_a_key_runs_direct_then_traces_then_replays(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    x = torch.randn(4, 5)
    traced = ed.cache_info().traced
    with ed.EagerDecompMode("core_aten") as mode:
        outs = [torch.nn.functional.hardswish(x) for _ in range(5)]
    row = mode.report().row("aten.hardswish.default")
    assert (row.direct, row.traces, row.hits) == (2, 1, 2), str(mode.report())
    assert ed.cache_info().traced == traced + 1
    want = torch.nn.functional.hardswish(x)
    for o in outs:
        assert torch.equal(o, want)
    assert "direct" in str(mode.report()).splitlines()[0]


def test_a_keys_eager_metadata_is_made_and_kept_once(monkeypatch):
    # the meta kernel over fakes costs more than most decompositions: a key's later direct
    # calls reuse what its first one kept, and keep nothing again
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "4")
    kept = []
    real = Tiers.keep
    monkeypatch.setattr(Tiers, "keep", lambda self, key, ref: kept.append(key) or real(self, key, ref))
    x = torch.randn(4, 5)
    with ed.EagerDecompMode("core_aten") as mode:
        outs = [torch.nn.functional.hardswish(x) for _ in range(4)]
    assert mode.report().row("aten.hardswish.default").direct == 4
    assert len(kept) == 1
    for o in outs:
        assert torch.equal(o, torch.nn.functional.hardswish(x))


def test_trace_after_zero_traces_at_the_first_call(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "0")
    with ed.EagerDecompMode("core_aten") as mode:
        torch.nn.functional.hardswish(torch.randn(3, 4))
    row = mode.report().row("aten.hardswish.default")
    assert (row.direct, row.traces) == (0, 1), str(mode.report())


def test_a_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "often")
    with pytest.raises(ed.errors.UnsupportedArgumentError, match="EAGERDECOMP_TRACE_AFTER"):
        trace_after()


def test_a_shape_family_grows_hot_although_no_key_repeats(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "1")
    from eagerdecomp.runtime.tiers import FAMILY_KEYS

    n = FAMILY_KEYS + 3
    xs = [torch.randn(3, length) for length in range(2, 2 + n)]  # a new key every call, one family
    want = [torch.nn.functional.hardswish(x) for x in xs]
    with ed.EagerDecompMode("core_aten") as mode:
        got = [torch.nn.functional.hardswish(x) for x in xs]
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    row = mode.report().row("aten.hardswish.default")
    assert row.direct == FAMILY_KEYS and row.traces + row.family >= 1, str(mode.report())


def _shape_generic_traces(monkeypatch) -> list:
    from eagerdecomp.runtime import core

    made, real = [], core.trace_family
    monkeypatch.setattr(core, "trace_family", lambda func, *a, **k: made.append(func) or real(func, *a, **k))
    return made


def test_a_fixed_set_of_shapes_keeps_exact_kernels(monkeypatch):
    # an optimizer's parameters: a handful of shapes met every step, never a new one after
    from eagerdecomp.runtime.tiers import FAMILY_TRACES

    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    made = _shape_generic_traces(monkeypatch)
    xs = [torch.randn(3, n) for n in range(2, 2 + FAMILY_TRACES - 1)]
    with ed.EagerDecompMode("core_aten") as mode:
        for _ in range(5):  # steps
            got = [torch.nn.functional.hardswish(x) for x in xs]
    assert made == []
    row = mode.report().row("aten.hardswish.default")
    assert row.traces == len(xs) and row.family == 0, str(mode.report())
    assert all(torch.equal(g, torch.nn.functional.hardswish(x)) for g, x in zip(got, xs))


def test_shapes_that_keep_changing_take_a_shape_generic_trace_once_exact_ones_add_up(monkeypatch):
    # dynamic padding in a deep model: a new length every step, its keys hot within the step
    from eagerdecomp.runtime.tiers import FAMILY_TRACES

    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    made = _shape_generic_traces(monkeypatch)
    with ed.EagerDecompMode("core_aten") as mode:
        for n in range(2, 2 + FAMILY_TRACES + 4):
            x = torch.randn(3, n)
            got = [torch.nn.functional.hardswish(x) for _ in range(4)]  # layers
            assert all(torch.equal(g, torch.nn.functional.hardswish(x)) for g in got)
    assert made == [aten.hardswish.default]
    row = mode.report().row("aten.hardswish.default")
    assert row.traces == FAMILY_TRACES + 1 and row.family >= 3, str(mode.report())


def test_no_path_found_direct_is_remembered_and_runs_nothing_twice(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    opset = ed.OpSet.preset("core_aten") - {"aten.mul.Tensor"}
    x = torch.randn(3)
    for _ in range(2):
        with pytest.raises(ed.errors.UnsupportedOpError, match="mul"):
            with ed.EagerDecompMode(opset):
                torch.nn.functional.silu(x)  # silu's decomposition needs mul
    # an in-place op whose path is cut: nothing written before the error
    y = torch.ones(3)
    with pytest.raises(ed.errors.UnsupportedOpError):
        with ed.EagerDecompMode(opset):
            y.mul_(2.0)
    assert torch.equal(y, torch.ones(3)) and y._version == 0


def test_in_place_direct_calls_bump_versions_as_eager(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "5")
    a, b = torch.randn(4), torch.randn(4)
    before_a, before_b = a._version, b._version
    a.add_(1.0).mul_(3.0)
    with ed.EagerDecompMode("core_aten"):
        b.add_(1.0).mul_(3.0)
    assert b._version - before_b == a._version - before_a


def test_a_direct_call_never_returns_its_input_memory_where_eager_does_not(monkeypatch):
    # take() of a 0-dim input: its decomposition returns a view, eager's kernel a new tensor
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    x = torch.tensor(3.0)
    with ed.EagerDecompMode("core_aten") as mode:
        got = torch.take(x, torch.tensor(0))
    assert mode.report().row("aten.take.default").direct == 1
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(got, torch.take(x, torch.tensor(0)))


def test_threads_share_a_cold_key_and_each_gets_eagers_result(monkeypatch):
    # several threads meet the same keys while they are cold, hot and traced: every call's result
    # is eager's, whichever tier served it (the counts are shared under a lock)
    import threading

    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "3")
    xs = [torch.randn(7, 5) for _ in range(8)]
    want = [(torch.nn.functional.hardswish(x), torch.logsumexp(x, 1)) for x in xs]
    got: dict = {}
    errors = []

    def work(i):
        try:
            with ed.EagerDecompMode("core_aten"):
                got[i] = [(torch.nn.functional.hardswish(x), torch.logsumexp(x, 1)) for x in xs]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        for (w1, w2), (g1, g2) in zip(want, got[i]):
            assert _same_bits(w1, g1) or torch.allclose(w1, g1, rtol=1e-6, atol=1e-7)
            assert torch.allclose(w2, g2, rtol=1e-6, atol=1e-6) and w2.stride() == g2.stride()


def test_direct_calls_on_arguments_that_share_memory_match_eager(monkeypatch):
    # one tensor twice, and two overlapping views of one storage: the full reference path
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    base = torch.randn(6, 8)
    a, b = base[:, :5], base[:, 3:]
    cases = [
        lambda: torch.nn.functional.smooth_l1_loss(base, base, reduction="none"),
        lambda: torch.nn.functional.smooth_l1_loss(a, b, reduction="none"),
        lambda: torch.lerp(a, b, 0.3),
    ]
    for fn in cases:
        want = fn()
        with ed.EagerDecompMode("core_aten") as mode:
            got = [fn() for _ in range(3)]  # direct, direct, traced
        assert sum(r.direct for r in mode.report().rows) >= 1, str(mode.report())
        for g in got:
            assert g.shape == want.shape and g.stride() == want.stride()
            torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)
        assert _same_bits(got[0], got[2])


def test_kept_metadata_reads_the_same_while_its_makers_mode_runs_a_kernel():
    # a key's metadata is kept for its next direct call, which may come from another thread while
    # the thread that made it runs a meta kernel in its own fake mode: a fake's device then reads
    # "meta" (FakeTensor.device), and the direct call raised "eager gives ... on meta"
    from eagerdecomp.runtime.exact import concrete_fake_mode, fakes_like, reference

    x = torch.randn(6, 4)[1:].t()  # a view: offset and strides kept, and it shares memory with x
    mode = concrete_fake_mode([x])
    ref = reference(torch.ops.aten.t.default, (x,), {}, mode, fakes_like(mode, [x]))
    kept = ref.frozen()
    mode.in_kernel_invocation = True
    try:
        assert ref.out(0).device.type == "meta"  # (what the race saw)
        out = kept.out(0)
        assert (out.device, out.dtype, out.shape, out.stride(), out.storage_offset()) == (
            x.device,
            x.dtype,
            x.t().shape,
            x.t().stride(),
            x.t().storage_offset(),
        )
        assert kept.shares == ref.shares == [True]
    finally:
        mode.in_kernel_invocation = False


@pytest.mark.parametrize("trace_after", ["2", "0"])
def test_a_decomposed_call_leaves_a_lazily_cloned_storage_shared(monkeypatch, trace_after):
    # eager's kernels that only read a copy-on-write tensor keep it shared (PyTorch's
    # test_lazy_clone_* device tests); a direct call asked its storage for its data pointer,
    # which copies it
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", trace_after)
    t = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    clone = t._lazy_clone()
    with ed.EagerDecompMode("core_aten") as mode:
        got = [torch.nn.functional.silu(t), t.t(), torch.nn.functional.silu(clone)]
    assert torch._C._is_cow_tensor(t) and torch._C._is_cow_tensor(clone)
    assert torch._C._data_address(t) == torch._C._data_address(clone)
    want = [torch.nn.functional.silu(t), t.t(), torch.nn.functional.silu(clone)]
    for w, g in zip(want, got):
        assert_like_eager(w, g, exact=False)
    assert mode.report().row("aten.silu.default").route == "decomposed"
