"""Lifting the floats of lists: AdamW's foreach path replays instead of tracing every step."""

import copy

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.demo import SmallCNN, train_step
from eagerdecomp.runtime import key as keys
from eagerdecomp.runtime.lift import Each, lift_positions, split, stand_ins, with_values

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten


def _base():
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(3, generator=g),
        torch.randn(3, 4, dtype=torch.float64, generator=g).t(),  # a strided one, another dtype
        torch.randn(2, 2, generator=g),
    ]


def _others():
    g = torch.Generator().manual_seed(1)
    a = [
        torch.randn(3, generator=g),
        torch.randn(4, 3, dtype=torch.float64, generator=g),
        torch.randn(2, 2, generator=g),
    ]
    return a, [t.abs() + 0.5 for t in a]


def _calls():
    a, b = _others()
    return {
        "addcdiv_.ScalarList": (aten._foreach_addcdiv_.ScalarList, lambda x, s: torch._foreach_addcdiv_(x, a, b, s)),
        "addcmul.ScalarList": (aten._foreach_addcmul.ScalarList, lambda x, s: torch._foreach_addcmul(x, a, b, s)),
        "div_.ScalarList": (aten._foreach_div_.ScalarList, lambda x, s: torch._foreach_div_(x, s)),
        "div.ScalarList": (aten._foreach_div.ScalarList, lambda x, s: torch._foreach_div(x, s)),
        "mul_.ScalarList": (aten._foreach_mul_.ScalarList, lambda x, s: torch._foreach_mul_(x, s)),
        "add.ScalarList": (aten._foreach_add.ScalarList, lambda x, s: torch._foreach_add(x, s)),
        "sub_.ScalarList": (aten._foreach_sub_.ScalarList, lambda x, s: torch._foreach_sub_(x, s)),
        "lerp.ScalarList": (aten._foreach_lerp.ScalarList, lambda x, s: torch._foreach_lerp(x, a, s)),
        "clamp_min.ScalarList": (aten._foreach_clamp_min.ScalarList, lambda x, s: torch._foreach_clamp_min(x, s)),
        "mul_.Scalar": (aten._foreach_mul_.Scalar, lambda x, s: torch._foreach_mul_(x, s[0])),
    }


# three calls whose values change but keep one value class per element
_VALUES = ([0.3, -0.07, 3.5], [0.45, -0.0011, 7.25], [0.4, -0.3, 1.5e3])
# NOTE: lerp's decomposition branches on its weight (as eager's kernel does): weights below
# 0.5 are lifted, larger ones keyed by value (test_lerp_weights_above_a_half_are_keyed_by_value)
_SMALL = ([0.3, -0.07, 0.25], [0.45, -0.0011, 0.125], [0.4, -0.3, 0.01])
_VALUES_OF = {"lerp.ScalarList": _SMALL}


# NOTE: addcmul's decomposition differs from eager's kernel by an ulp without any lifting too
# (torch.addcmul(x, a, b, value=1.0) in float64 under the mode: 2.2e-16): compared with eager
# to the default tolerance, and bitwise with the same op keyed by value. Every other op here
# is bitwise eager's.
_ROUNDS_DIFFERENTLY = {"addcmul.ScalarList"}


@pytest.fixture
def by_value(monkeypatch):
    """Makes a mode that keys every float by value, as before lists were lifted (the reference).

    Call it after the lifting mode's calls: a runtime reads the positions once per op."""
    import eagerdecomp.runtime.core

    def make():
        monkeypatch.setattr(eagerdecomp.runtime.core, "lift_positions", lambda func: ())
        mode = ed.EagerDecompMode("core_aten")
        # NOTE: on the Python hit path: the C++ table is shared per cache, and the lifting
        # mode's programs (with its lift positions) would answer this mode's calls too
        mode.runtime.hits = mode.runtime.stats.hits = None
        return mode

    return make


def _assert_same(got, want, exact=True):
    assert type(got) is type(want)
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w, exact)
        return
    assert (
        got is None and want is None or (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    )
    if want is not None:
        tol = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(got, want, equal_nan=True, **tol)


def _run(fn, values, mode=None):
    """``fn`` on fresh copies for each list of values, under ``mode`` if given: (inputs after, results)."""
    xs, outs = [], []
    for v in values:
        x = [t.clone() for t in _base()]
        if mode is None:
            outs.append(fn(x, list(v)))
        else:
            with mode:
                outs.append(fn(x, list(v)))
        xs.append(x)
    return xs, outs


@pytest.mark.parametrize("name", sorted(_calls()))
def test_foreach_with_changing_floats_matches_eager_and_replays(name):
    op, fn = _calls()[name]
    values = _VALUES_OF.get(name, _VALUES)
    ed.cache_clear()
    want_x, want = _run(fn, values)
    mode = ed.EagerDecompMode("core_aten")
    got_x, got = _run(fn, values, mode)
    exact = name not in _ROUNDS_DIFFERENTLY
    _assert_same(got_x, want_x, exact)  # the in-place forms wrote every tensor alike
    _assert_same(got, want, exact)
    row = mode.report().row(op)
    assert row.lifted and not row.by_value
    assert row.traces == 1 and row.hits == len(values) - 1, (row.traces, row.hits)


def test_lerp_weights_above_a_half_are_keyed_by_value():
    # the large branch's coefficient (weight - 1, rounded as the dtype holds it) is computed
    # at trace time, so it cannot be an input: each value has its kernel, bitwise eager's
    op, fn = _calls()["lerp.ScalarList"]
    values = ([0.3, 0.75, 3.5], [0.3, 0.9, 7.25])
    want_x, want = _run(fn, values)
    mode = ed.EagerDecompMode("core_aten")
    got_x, got = _run(fn, values, mode)
    _assert_same(got, want, exact=True)
    row = mode.report().row(op)
    assert row.by_value and row.traces == len(values)


@pytest.mark.parametrize("name", sorted(_ROUNDS_DIFFERENTLY))
def test_lifting_changes_no_bit_of_what_keys_by_value_compute(name, by_value):
    op, fn = _calls()[name]
    mode = ed.EagerDecompMode("core_aten")
    values = _VALUES_OF.get(name, _VALUES)
    got_x, got = _run(fn, values, mode)
    assert mode.report().row(op).lifted
    ref = by_value()
    want_x, want = _run(fn, values, ref)
    assert not ref.report().row(op).lifted and ref.report().row(op).traces == len(values)
    _assert_same(got_x, want_x)
    _assert_same(got, want)


def test_a_second_call_with_other_values_replays_without_a_trace():
    ed.cache_clear()
    a, b = _others()
    x = [t.clone() for t in _base()]
    with ed.EagerDecompMode("core_aten") as mode:
        torch._foreach_addcdiv_(x, a, b, [-0.01, -0.01, -0.01])
    row = mode.report().row(aten._foreach_addcdiv_.ScalarList)
    assert (row.traces, row.hits) == (1, 0)
    want = [t.clone() for t in _base()]
    torch._foreach_addcdiv_(want, a, b, [-0.003, -0.25, -0.0001])
    x = [t.clone() for t in _base()]
    with mode:
        torch._foreach_addcdiv_(x, a, b, [-0.003, -0.25, -0.0001])
    _assert_same(x, want)
    row = mode.report().row(aten._foreach_addcdiv_.ScalarList)
    assert (row.traces, row.hits) == (1, 1) and row.lifted


def test_special_values_in_a_list_keep_kernels_of_their_own():
    ed.cache_clear()
    # each list has a special value somewhere else, or a different one: each is its own key
    values = (
        [1.0, 0.3, 0.3],
        [2.0, 0.3, 0.3],
        [0.3, 0.0, 0.3],
        [0.3, -0.5, 0.3],
        [0.3, 0.3, float("inf")],
        [0.3, float("nan"), 0.3],
        [0.3, 0.3, -float("inf")],
    )
    _, fn = _calls()["div.ScalarList"]
    want_x, want = _run(fn, values)
    mode = ed.EagerDecompMode("core_aten")
    got_x, got = _run(fn, values, mode)
    _assert_same(got, want)
    assert mode.report().row(aten._foreach_div.ScalarList).traces == len(values)
    # ... and the same specials with other ordinary values replay them
    again = ([1.0, 0.4, 0.05], [2.0, 0.1, 0.01], [0.25, 0.0, 0.125])
    want_x, want = _run(fn, again)
    got_x, got = _run(fn, again, mode)
    _assert_same(got, want)
    assert mode.report().row(aten._foreach_div.ScalarList).traces == len(values)


def test_ints_in_a_scalar_list_keep_their_value():
    x = [torch.ones(2), torch.ones(2)]
    args, _, lifted = split(lift_positions(aten._foreach_mul.ScalarList), (x, [3, 0.3]), {})
    assert lifted == [((1, 1), 0.3)] and args[1][0] == 3 and type(args[1][0]) is int


def test_which_lists_are_candidates():
    assert lift_positions(aten._foreach_addcdiv_.ScalarList) == (Each(3),)
    assert lift_positions(aten._foreach_div_.ScalarList) == (Each(1),)
    assert lift_positions(aten._foreach_lerp_.ScalarList) == (Each(2),)
    assert lift_positions(aten._foreach_mul_.Scalar) == (1,)  # an lr schedule's weight decay
    assert lift_positions(aten._foreach_add_.List) == ("alpha",)
    assert lift_positions(aten._foreach_norm.Scalar) == ()  # norm is not pointwise: ord kept by value
    assert lift_positions(aten._foreach_div.ScalarList_out) == ()  # no per-tensor op found: kept by value
    assert lift_positions(aten.upsample_bilinear2d.vec) == ()  # scale factors size the output


def test_split_leaves_the_callers_list_alone_and_with_values_puts_elements_back():
    x = [torch.ones(2), torch.ones(2), torch.ones(2)]
    scalars = [0.3, 1.0, -7.0]
    args, kwargs, lifted = split((Each(1),), (x, scalars), {})
    assert scalars == [0.3, 1.0, -7.0] and args[1] is not scalars and type(args[1]) is list
    assert lifted == [((1, 0), 0.3), ((1, 2), -7.0)] and args[1][1] == 1.0
    a, k = with_values(args, kwargs, lifted, stand_ins(lifted, 0))
    assert a[1][1] == 1.0 and a[1][0] != 0.3 and 0 < a[1][0] < 1 and a[1][2] < -1
    kw = split((Each("weights"),), (x,), {"weights": (0.3, 0.6)})
    assert [p for p, _ in kw[2]] == [("weights", 0), ("weights", 1)] and type(kw[1]["weights"]) is tuple
    assert split((Each(1),), (x, None), {})[2] == []  # an absent optional list


def test_both_key_builders_agree_on_lifted_lists():
    op = aten._foreach_addcdiv_.ScalarList
    x = [torch.ones(2), torch.ones(3)]
    one = split(lift_positions(op), (x, x, x, [0.3, 1.0]), {})
    two = split(lift_positions(op), (x, x, x, [0.4, 1.0]), {})
    three = split(lift_positions(op), (x, x, x, [0.6, 2.0]), {})
    assert keys.make_key(op, *one[:2])[0] == keys.make_key_py(op, *one[:2])[0]
    assert keys.make_key(op, *one[:2])[0] == keys.make_key(op, *two[:2])[0]
    assert keys.make_key(op, *one[:2])[0] != keys.make_key(op, *three[:2])[0]


def _grads(params, n):
    g = torch.Generator().manual_seed(2)
    return [[torch.randn(p.shape, generator=g) for p in params] for _ in range(n)]


def _misses(mode):
    return sum(r.misses for r in mode.report().rows)


def _adamw_run(params, grads, mode=None, steps_seen=None):
    """AdamW(foreach=True) with a schedule over ``grads``; each step under ``mode`` if given.

    ``steps_seen`` collects the kernels made by the end of each step."""
    opt = torch.optim.AdamW(params, lr=1e-2, foreach=True)
    # a schedule makes the weight decay's factor change every step too
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    history = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        if mode is None:
            opt.step()
        else:
            with mode:
                opt.step()
            if steps_seen is not None:
                steps_seen.append(_misses(mode))
        sched.step()
        history.append(
            [p.detach().clone() for p in params] + [s[k].clone() for s in opt.state.values() for k in sorted(s)]
        )
    return history


def test_adamw_foreach_steps_match_native_and_stop_tracing(by_value):
    ed.cache_clear()
    torch.manual_seed(0)
    start = [torch.randn(s) for s in ((4, 3), (3,), (2, 2, 2))]
    fresh = lambda: [torch.nn.Parameter(p.clone()) for p in start]  # noqa: E731
    grads = _grads(start, 6)
    native = _adamw_run(fresh(), grads)
    mode, made = ed.EagerDecompMode("core_aten"), []
    ours = _adamw_run(fresh(), grads, mode, made)
    # no kernel is made after the second step: the step sizes are lifted, not keys
    assert made[1:] == [made[1]] * (len(made) - 1), made
    report = mode.report()
    for op in (aten._foreach_addcdiv_.ScalarList, aten._foreach_div_.ScalarList, aten._foreach_mul_.Scalar):
        row = report.row(op)
        assert row.lifted and not row.by_value and row.traces == 1, (op, row.traces)
    # eager's values to the rounding of lerp's decomposition (exp_avg), which Adam carries on
    for step, (o, n) in enumerate(zip(ours, native)):
        for a, b in zip(o, n):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, step=step: f"step {step}: {m}")
    # and bitwise what the same mode computes with every float keyed by value
    ref = by_value()
    keyed = _adamw_run(fresh(), grads, ref)
    assert not ref.report().row(aten._foreach_addcdiv_.ScalarList).lifted
    for step, (o, k) in enumerate(zip(ours, keyed)):
        assert all(torch.equal(a, b) for a, b in zip(o, k)), step


def test_adamw_foreach_training_matches_native_and_stops_tracing():
    ed.cache_clear()
    torch.manual_seed(0)
    native = SmallCNN()
    ours = copy.deepcopy(native)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-2, foreach=True)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-2, foreach=True)
    x, y = SmallCNN.batch()
    mode = ed.EagerDecompMode("core_aten")
    after_two = None
    for step in range(4):
        train_step(native, opt_n, x, y)
        with mode:
            _, _, grads = train_step(ours, opt_o, x, y)
        if step == 1:
            after_two = _misses(mode)
    assert _misses(mode) == after_two, [(r.op, r.misses) for r in mode.report().rows if r.misses]
    # as tests/test_training.py: where a gradient is zero in exact arithmetic, Adam turns
    # rounding noise into a full step; compare where the gradient carries signal
    for p, q, g in zip(native.parameters(), ours.parameters(), grads):
        signal = g.abs() > 1e-4 * g.abs().max().clamp_min(1e-30)
        torch.testing.assert_close(q[signal], p[signal], rtol=1e-3, atol=1e-5)
    assert mode.report().row(aten._foreach_addcdiv_.ScalarList).lifted
