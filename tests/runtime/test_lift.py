"""Scalar lifting: one kernel for every ordinary float, and never a different answer."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.runtime.lift import SPECIAL, _band, lift_positions, split, stand_ins

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten


def _row(mode, op):
    return mode.report().row(op)


def test_changing_float_traces_once_per_class():
    x, a, b = torch.randn(5), torch.randn(5), torch.rand(5) + 0.5
    values = [-0.001 * k for k in range(1, 8)]
    expected = [x.clone().addcdiv_(a, b, value=v) for v in values]
    with ed.EagerDecompMode("core_aten") as m:
        got = [x.clone().addcdiv_(a, b, value=v) for v in values]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    row = _row(m, aten.addcdiv_.default)
    assert row.lifted and row.traces <= 1 and row.calls == len(values)


def test_special_values_and_classes_get_their_own_kernels():
    x, a, b = torch.randn(5), torch.randn(5), torch.randn(5)
    ed.cache_clear()
    values = (0.25, 0.75, 3.0, 5.0, -0.25, -4.0, 1.0, 0.0, 2.0, float("inf"))
    expected = [torch.addcmul(x, a, b, value=v) for v in values]
    with ed.EagerDecompMode("core_aten") as m:
        got = [torch.addcmul(x, a, b, value=v) for v in values]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    # five classes (+ below 0.5, + 0.5 to 1, + above 1, - below 0.5, - above 1) plus four
    # special values, each one kernel
    assert _row(m, aten.addcmul.default).traces == 9


def test_graph_that_depends_on_the_value_falls_back_to_keys_by_value():
    # a decomposition that branches on its float in Python: lifting must notice and refuse
    def softplus(x, beta=1.0, threshold=20.0):
        return x * 3.0 if beta > 7.5 else x * 5.0

    x = torch.randn(4)
    with ed.EagerDecompMode("core_aten", decompositions={aten.softplus.default: softplus}) as m:
        low = torch.nn.functional.softplus(x, beta=3.0)
        high = torch.nn.functional.softplus(x, beta=9.0)
    torch.testing.assert_close(low, x * 5.0)
    torch.testing.assert_close(high, x * 3.0)
    row = _row(m, aten.softplus.default)
    assert row.by_value and not row.lifted


def test_value_computed_into_a_constant_is_refused():
    def softplus(x, beta=1.0, threshold=20.0):
        return x * (beta * 2)  # a Python product: baked into the graph as a literal

    x = torch.randn(4)
    with ed.EagerDecompMode("core_aten", decompositions={aten.softplus.default: softplus}) as m:
        for beta in (3.0, 4.0):
            torch.testing.assert_close(torch.nn.functional.softplus(x, beta=beta), x * (beta * 2))
    assert _row(m, aten.softplus.default).by_value


def test_only_pointwise_float_arguments_are_candidates():
    assert lift_positions(aten.addcdiv_.default) == ("value",)
    assert lift_positions(aten.lerp_.Scalar) == (2,)
    assert lift_positions(aten.sum.dim_IntList) == ()


def test_split_replaces_only_ordinary_floats():
    x = torch.ones(2)
    for special in sorted(SPECIAL):
        assert split(("value",), (x,), {"value": special})[2] == []
    args, kwargs, lifted = split(("value",), (x,), {"value": 0.125})
    assert lifted == [("value", 0.125)] and kwargs["value"] is not None and type(kwargs["value"]) is not float
    assert split((1,), (x, 3), {})[2] == []  # ints keep their value: they may be sizes or dims


@pytest.mark.parametrize("v", [0.3, 0.7, 3.0, -0.3, -0.7, -3.0])
def test_stand_ins_stay_in_class_and_differ(v):
    lifted = [(0, v), (1, v)]
    a, b = stand_ins(lifted, 0), stand_ins(lifted, 1)
    for s in a + b:
        assert (s < 0) == (v < 0) and _band(abs(s)) == _band(abs(v)) and s not in SPECIAL
    assert len(set(a + b)) == 4
    assert (a[0] < a[1]) != (b[0] < b[1])  # the order of two lifted floats differs between traces


@pytest.mark.parametrize("v", [0.5 - 2.0**-27, -(0.5 - 2.0**-27), 1 - 2.0**-26, 1 + 2.0**-25, 2 + 2.0**-23, 1e39])
def test_floats_that_round_to_a_special_value_in_float32_are_keyed_by_value(v):
    # a float32 kernel sees them as the special value itself: a kernel traced for the class
    # (at stand-ins away from the edge) need not hold for them
    x = torch.ones(2)
    assert split(("value",), (x,), {"value": v})[2] == []
    assert split(("value",), (x,), {"value": 0.5 - 2.0**-20})[2] != []


def test_float32_rounding_agrees_between_the_python_and_cpp_keys():
    # the C++ table and Python must lift exactly the same floats, or a program would read
    # an input its key never took
    from eagerdecomp.runtime import hits

    if not hits.enabled():
        pytest.skip("the C++ hit path is off")
    x, a, b = torch.randn(5), torch.randn(5), torch.randn(5)
    values = (0.5 - 2.0**-27, 0.5 - 2.0**-20, 1 - 2.0**-26, 0.3, 0.3000001, 2 + 2.0**-23)
    expected = {v: torch.addcmul(x, a, b, value=v) for v in values}
    ed.cache_clear()
    with ed.EagerDecompMode("core_aten") as m:
        for v in values:
            for _ in range(3):  # the later calls are the C++ table's
                torch.testing.assert_close(torch.addcmul(x, a, b, value=v), expected[v], equal_nan=True)
    # one kernel for the three ordinary floats below 0.5, one by value for each of the others;
    # every later call served in C++ (a C++ key lifting one of the three would hit the band's
    # kernel instead, and the misses would be fewer)
    row = _row(m, aten.addcmul.default)
    assert (row.misses, row.traces) == (4, 4)
    assert row.cpp_hits == 3 * len(values) - 4 and row.python_replay == []
