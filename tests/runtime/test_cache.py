import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.runtime.cache import Bypassed, KernelCache

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten


def test_hit_miss_trace_counters():
    x = torch.randn(5)
    with ed.EagerDecompMode("core_aten") as m:
        torch.ops.aten.hardswish.default(x)  # decomposed; may already be cached by another test
        before = m.runtime.cache.info()
        for _ in range(3):
            torch.ops.aten.hardswish.default(x)
        torch.ops.aten.hardswish.default(torch.randn(6))  # new shape: a new key
    row = m.report().row(aten.hardswish.default)
    assert row.hits + row.misses == 5
    after = m.runtime.cache.info()
    assert after.hits - before.hits >= 3
    assert row.traces == row.misses


def test_second_mode_is_warm():
    x = torch.randn(7, 3)
    with ed.EagerDecompMode("core_aten"):
        torch.nn.functional.softplus(x, beta=3.0)
    with ed.EagerDecompMode("core_aten") as m:
        torch.nn.functional.softplus(x, beta=3.0)
    row = m.report().row(aten.softplus.default)
    assert (row.hits, row.misses, row.traces) == (1, 0, 0)


def test_scalar_values_trace_once_each():
    x = torch.randn(4)
    with ed.EagerDecompMode("core_aten") as m:
        for beta in (1.5, 2.5, 3.5, 1.5, 2.5):
            torch.nn.functional.softplus(x, beta=beta)
    row = m.report().row(aten.softplus.default)
    assert row.hits + row.misses == 5 and row.hits >= 2


def test_lru_bound():
    c = KernelCache(maxsize=2)
    for k in "abc":
        c.put(k, 1)
    assert len(c) == 2 and c.get("a") is None and c.get("c") == 1
    c.get("b")  # b most recently used: d evicts c
    c.put("d", 1)
    assert c.get("c") is None and c.get("b") == 1
    info = c.info()
    assert info.size == 2 and info.maxsize == 2


def test_negative_entry_remembers_bypass():
    calls = []

    def needs_value(x):
        calls.append(1)
        scale = x.abs().max().item()  # a data value: cannot be traced over fake tensors
        return x / scale

    x = torch.randn(5)
    with ed.EagerDecompMode("core_aten", decompositions={aten.hardswish.default: needs_value}) as m:
        for _ in range(3):
            out = torch.ops.aten.hardswish.default(x)
    torch.testing.assert_close(out, x / x.abs().max())
    row = m.report().row(aten.hardswish.default)
    assert row.route == "bypassed" and row.misses == 1 and row.remembered == 2
    assert row.negative == {"needs a data value": 3}
    assert isinstance(next(v for v in m.runtime.cache._lru.values() if isinstance(v, Bypassed)), Bypassed)


def test_cache_info_and_clear():
    with ed.EagerDecompMode("core_aten"):
        torch.nn.functional.silu(torch.randn(3))
    assert ed.cache_info().size >= 1
    ed.cache_clear()
    info = ed.cache_info()
    assert info.size == 0 and info.hits == 0 and info.misses == 0
