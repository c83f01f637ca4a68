"""Replay of a kernel traced or loaded from disk (a bundle, a shape family): its first calls
walk the graph node by node, the next one makes its ``fx.GraphModule``; both give what the
traced kernel gives, bit for bit, with its views and in-place writes. On the C++ paths a
traced kernel's module is never made."""

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.runtime import disk, keymode, replay
from eagerdecomp.runtime.family import read_ints

pytestmark = pytest.mark.usefixtures("trace_first")  # (one call traces the kernel)

aten = torch.ops.aten


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(5, 7, generator=g),
        "t": torch.randn(7, 5, generator=g).t(),  # a transposed input
        "y": torch.randn(5, 7, generator=g),
    }


# op -> (the call, its arguments); no lifted floats
CASES = {
    "mish": (aten.mish.default, lambda v: ((v["t"],), {})),
    "logsumexp": (aten.logsumexp.default, lambda v: ((v["x"], [1], True), {})),
    "split": (aten.split.Tensor, lambda v: ((v["x"], 2), {})),  # views of the input
    "addcmul_": (aten.addcmul_.default, lambda v: ((v["y"], v["x"], v["t"]), {})),  # writes its input
    "silu_backward": (aten.silu_backward.default, lambda v: ((v["y"], v["x"]), {})),
}


@pytest.fixture
def no_disk(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_DISK_CACHE", "0")
    monkeypatch.setenv("EAGERDECOMP_KEY_MODE", "0")  # (the Python path keeps the kernel in its cache)
    ed.cache_clear()
    yield
    ed.cache_clear()


@pytest.mark.parametrize("name", CASES)
def test_a_loaded_kernel_walks_its_graph_then_makes_its_module(no_disk, name):
    op, call = CASES[name]
    mode = ed.EagerDecompMode("core_aten")
    with mode:
        op(*call(_tensors())[0])
    (kernel,) = mode.runtime.cache.kernels_of(op)
    loaded = disk._kernel_from(disk._kernel_data(kernel))
    assert type(loaded._module) is replay.Deferred

    for i in range(replay.INTERPRETED + 1):
        theirs, ours = _tensors(), _tensors()
        (args_t, _), (args_o, _) = call(theirs), call(ours)
        keyed = [a for a in args_t if isinstance(a, torch.Tensor)]
        mine = [a for a in args_o if isinstance(a, torch.Tensor)]
        ints = list(read_ints(kernel.ints, args_t, {}))  # (a shape-generic kernel's int inputs)
        want, got = kernel(keyed + ints), loaded(mine + ints)
        # walked for the first INTERPRETED calls, then made
        assert (type(loaded._module) is replay.Deferred) == (i < replay.INTERPRETED)
        wants, gots = (list(want), list(got)) if isinstance(want, (tuple, list)) else ([want], [got])
        assert type(want) is type(got) and len(wants) == len(gots)
        for w, g in zip(wants, gots):
            assert torch.equal(w, g) and w.dtype == g.dtype and w.stride() == g.stride()
            # the same aliasing of the inputs: a view shares its input's storage, a write returns it
            for a, b in zip(keyed, mine):
                assert (w is a) == (g is b)
                assert (w.untyped_storage()._cdata == a.untyped_storage()._cdata) == (
                    g.untyped_storage()._cdata == b.untyped_storage()._cdata
                )
        for a, b in zip(keyed, mine):  # what the call wrote
            assert torch.equal(a, b)
    assert isinstance(loaded.module, fx.GraphModule)


@pytest.mark.skipif(keymode.key() is None, reason="the C++ key path needs the C++ library")
def test_a_kernel_traced_on_the_cxx_key_never_makes_its_module(monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_DISK_CACHE", "0")
    ed.cache_clear()
    v = _tensors()
    y = v["y"].clone()
    with ed.EagerDecompMode("core_aten") as mode:
        for _ in range(4):  # traced (a lifted float: two stand-in traces compared), then C++ hits
            aten.addcmul_.default(y, v["x"], v["t"], value=0.3)
            aten.mish.default(v["t"])
    want = v["y"].clone()
    for _ in range(4):
        want.addcmul_(v["x"], v["t"], value=0.3)
    torch.testing.assert_close(y, want)  # (addcmul's decomposition is within an ulp: docs/limits.md)
    for op in (aten.addcmul_.default, aten.mish.default):
        (kernel,) = mode.runtime.cache.kernels_of(op)
        assert type(kernel._module) is replay.Deferred, op
        assert mode.report().row(op).cpp_hits == 3
    ed.cache_clear()


def test_a_graph_with_another_kind_of_node_makes_its_module_at_once(no_disk):
    mode = ed.EagerDecompMode("core_aten")
    x = torch.randn(4)
    with mode:
        F.mish(x)
    (kernel,) = mode.runtime.cache.kernels_of(aten.mish.default)
    loaded = disk._kernel_from(disk._kernel_data(kernel))
    graph = loaded._module.graph
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        graph.call_method("abs", (next(iter(graph.nodes)),))  # (unused: only its kind matters)
    assert loaded._module.run([x]) is None  # not walked
    assert torch.equal(loaded([x]), kernel([x]))
    assert isinstance(loaded._module, fx.GraphModule)
