"""The C++ hit path (csrc/hit.cpp, eagerdecomp/hits.py): hits served in C++ give what the
pure-Python path gives, bit for bit, and each gives what native eager gives (values to rounding,
dtypes, shapes, strides, aliasing), with eager's identity, overlap errors and counts."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import eagerdecomp as ed
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import hits
from eagerdecomp.testing import KernelWitness
from tests.compare import assert_like_eager

pytestmark = [
    pytest.mark.skipif(not hits.enabled(), reason="C++ library not built (pure-Python path)"),
    pytest.mark.usefixtures("trace_first"),
]  # tests of traced kernels (conftest.trace_first)
aten = torch.ops.aten


def _modes():
    fast = ed.EagerDecompMode("core_aten")
    slow = ed.EagerDecompMode("core_aten")
    slow.runtime.hits = slow.runtime.stats.hits = None  # the pure-Python hit path
    return fast, slow


def _same(want, fast, slow, inputs):
    """Both paths give native eager's answer (``want``; the decompositions round as core ops do,
    not as the fused kernels), and the C++ one the Python one's, bit for bit: one kernel."""
    assert_like_eager(want, fast, exact=False, inputs=inputs)
    assert_like_eager(want, slow, exact=False, inputs=inputs)
    assert_like_eager(slow, fast)


# (name, fn(x) -> out): functional ops, views, lists, multi-output, lifted floats, shape-generic
CASES = [
    ("silu", lambda x: torch.nn.functional.silu(x)),
    ("addcmul lifted", lambda x: torch.addcmul(x, x, x, value=0.37)),
    ("add_ alpha and other lifted", lambda x: aten.add_.Tensor(x.clone(), 0.3, alpha=0.7)),
    ("lerp", lambda x: torch.lerp(x, x.flip(0), 0.25)),
    ("stack", lambda x: torch.stack([x, x * 2])),
    ("chunk (Tensor[] of views)", lambda x: x.chunk(2)),
    ("unbind", lambda x: x.unbind(0)),
    ("roll (shape-generic sizes)", lambda x: torch.roll(x, 1, 0)),
    ("var_mean (tuple)", lambda x: torch.var_mean(x, 0)),
    (
        "nll_loss (namedtuple)",
        lambda x: aten.nll_loss_forward.default(
            x.log_softmax(-1), torch.zeros(x.shape[0], dtype=torch.long), None, 1, -100
        ),
    ),
    ("t (view)", lambda x: x.t()),
    ("detach (view)", lambda x: x.detach()),
    ("new_zeros (dtype kwarg)", lambda x: x.new_zeros(3, 2, dtype=torch.float64)),
    ("hardtanh_ int bounds", lambda x: torch.nn.functional.hardtanh(x.clone(), -1, 2, inplace=True)),
    ("softplus", lambda x: torch.nn.functional.softplus(x, 2.0, 20.0)),
    ("gelu_backward (str arg)", lambda x: aten.gelu_backward.default(x, x.flip(0), approximate="tanh")),
    ("transposed input", lambda x: torch.nn.functional.silu(x.t())),
]


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_hits_match_the_python_path(name, fn):
    fast, slow = _modes()
    for n in (4, 6, 4, 6):  # shapes that change: exact keys, and a family's new member
        x = torch.randn(n, 6)
        with fast:
            for _ in range(3):
                a = fn(x)
        with slow:
            b = fn(x)
        _same(fn(x), a, b, [x])
    rows = [r for r in fast.report().rows if r.route == "decomposed"]
    assert rows and sum(r.cpp_hits for r in rows) > 0, fast.report()


def test_views_alias_and_in_place_returns_its_input():
    fast, _ = _modes()
    x = torch.randn(5, 3)
    with fast:
        for _ in range(3):
            t = x.t()
            y = x.clone()
            z = y.add_(1.5)
            parts = x.chunk(2)
    assert t._base is x and t.data_ptr() == x.data_ptr()
    assert z is y and torch.equal(y, x + 1.5)
    assert all(p._base is x for p in parts)
    assert fast.report().row(aten.add_.Tensor).cpp_hits >= 1


def test_counts_are_exact():
    ed.cache_clear()  # the first call must trace here, whatever earlier tests left in the cache
    fast, _ = _modes()
    x = torch.randn(8)
    with fast:
        for _ in range(10):
            torch.nn.functional.silu(x)
    row = fast.report().row(aten.silu.default)
    assert (row.calls, row.hits, row.cpp_hits) == (10, 9, 9)  # traced (and installed), then C++
    fast.runtime.stats.clear()
    assert fast.report().row(aten.silu.default) is None


def test_overlap_errors_are_raised_on_every_hit():
    fast, slow = _modes()
    for mode in (fast, slow):
        x = torch.arange(6.0)
        for _ in range(4):
            with pytest.raises(RuntimeError, match="refer to a single memory location"), mode:
                torch.add(x[:-1], 10, out=x[1:])
        x = torch.arange(6.0)
        for _ in range(4):  # the same key without the overlap: fine on every call
            y = torch.arange(6.0)
            with mode:
                torch.add(x[:-1], 10, out=y[1:])
            assert torch.equal(y[1:], x[:-1] + 10)
    assert fast.report().row(aten.add.out).cpp_hits >= 1


def test_lifted_floats_change_every_call():
    fast, slow = _modes()
    x = torch.randn(16)
    for i in range(6):
        v = 0.1 + i / 7
        with fast:
            a = torch.addcmul(x, x, x, value=v)
            c = aten.add_.Tensor(x.clone(), 3.5 + i, alpha=0.25 + i / 50)
        with slow:
            b = torch.addcmul(x, x, x, value=v)
            d = aten.add_.Tensor(x.clone(), 3.5 + i, alpha=0.25 + i / 50)
        _same(torch.addcmul(x, x, x, value=v), a, b, [x])
        _same(aten.add_.Tensor(x.clone(), 3.5 + i, alpha=0.25 + i / 50), c, d, [x])
    assert fast.report().row(aten.addcmul.default).cpp_hits >= 3
    assert fast.report().row(aten.add_.Tensor).cpp_hits >= 3


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["C++ key", "Python"])
def test_only_opset_ops_reach_below_on_hits(path):
    # NOTE: each path keys a call its own way (the C++ key from the boxed stack, the Python path
    # from the Python arguments: csrc/hit.cpp's key_stack and key_py), so a program one installs
    # answers that path's calls; both blocks take one path. The witness of the key path is
    # KernelWitness (a C++ key below the mode's); a Python mode outside gives the Python path
    fast, _ = _modes()
    opset = OpSet.coerce("core_aten")
    x = torch.randn(4, 4)
    outside = contextlib.nullcontext if path == "C++ key" else Recorder
    with outside(), fast:  # trace and install first, outside the witness
        for _ in range(3):
            torch.nn.functional.silu(x), torch.roll(x, 1, 0), x.chunk(2)
    before = fast.report().row(aten.silu.default).cpp_hits
    witness = KernelWitness() if path == "C++ key" else Recorder()
    with witness as rec, fast:
        torch.nn.functional.silu(x), torch.roll(x, 1, 0), x.chunk(2)
    assert fast.path.startswith(path), fast.path
    assert fast.report().row(aten.silu.default).cpp_hits == before + 1
    assert rec.ops and all(op in opset for op in rec.ops), sorted(str(op) for op in rec.ops if op not in opset)


def test_cache_clear_empties_the_tables():
    fast, _ = _modes()
    x = torch.randn(3)
    with fast:
        for _ in range(3):
            torch.nn.functional.silu(x)
    assert len(fast.runtime.hits) >= 1
    ed.cache_clear()
    assert len(fast.runtime.hits) == 0 and ed.cache_info().hits == 0
    before = fast.report().row(aten.silu.default)
    with fast:
        torch.nn.functional.silu(x)
    after = fast.report().row(aten.silu.default)
    assert after.traces == before.traces + 1 and after.cpp_hits == before.cpp_hits


def test_threads_share_a_table():
    fast, _ = _modes()
    xs = [torch.randn(32, 8) for _ in range(4)]
    want = [x * torch.sigmoid(x) for x in xs]
    errors = []

    def work(i):
        try:
            with fast:
                for _ in range(200):
                    for x, w in zip(xs, want):
                        assert torch.equal(torch.nn.functional.silu(x), w)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    row = fast.report().row(aten.silu.default)
    assert row.calls == 4 * 200 * 4 and row.cpp_hits > 0


def test_kernels_that_re_raise_warnings_stay_in_python():
    fast, _ = _modes()
    x = torch.randn(4)
    with fast, pytest.warns(UserWarning):
        for _ in range(3):
            aten.silu.out(x, out=torch.empty(3))  # resizes a non-empty out=: warns every call
    row = fast.report().row(aten.silu.out)
    assert row.cpp_hits == 0 and row.python_replay, row


# -- the device switch ------------------------------------------------------------------------


@pytest.fixture
def edref():
    from eagerdecomp import device as device_switch
    from eagerdecomp.device.refdev import reference_device

    dev = reference_device()
    device_switch.disable(dev.type)
    b = device_switch.enable(dev.type)
    yield dev, b
    device_switch.disable(dev.type)


def test_device_hits_are_served_in_cpp(edref):
    dev, b = edref
    x = torch.randn(6, 5)
    xd = x.to(dev)
    for _ in range(4):
        y = torch.nn.functional.silu(xd)
        z = torch.addcmul(xd, xd, xd, value=0.3)
        parts = xd.chunk(2)
    assert torch.equal(y.cpu(), x * torch.sigmoid(x))
    assert torch.allclose(z.cpu(), torch.addcmul(x, x, x, value=0.3))
    assert all(p.data_ptr() >= xd.data_ptr() for p in parts)
    rep = b.report()
    assert rep.row(aten.silu.default).cpp_hits >= 2
    assert rep.row(aten.silu.default).calls == 4


def test_device_errors_propagate_from_a_miss(edref):
    dev, b = edref
    x = torch.arange(6.0).to(dev)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            torch.add(x[:-1], 10, out=x[1:])


def test_device_disable_removes_the_fallback(edref):
    from eagerdecomp import device as device_switch

    dev, b = edref
    x = torch.randn(4).to(dev)
    torch.nn.functional.silu(x)
    device_switch.disable(dev.type)
    with pytest.raises(NotImplementedError):
        torch.nn.functional.silu(x)
    device_switch.enable(dev.type)
    assert torch.allclose(torch.nn.functional.silu(x).cpu(), torch.nn.functional.silu(x.cpu()))


def test_a_new_mode_per_step_starts_warm():
    x = torch.randn(7, 3)
    with ed.EagerDecompMode("core_aten"):
        for _ in range(2):
            torch.nn.functional.silu(x)
    fresh = ed.EagerDecompMode("core_aten")  # as `with EagerDecompMode(): step()` in a loop makes
    with fresh:
        y = torch.nn.functional.silu(x)
    row = fresh.report().row(aten.silu.default)
    assert (row.calls, row.cpp_hits) == (1, 1)  # served in C++ from its first call
    assert row.into == ["aten.mul.Tensor", "aten.sigmoid.default"]  # read from the shared cache
    assert torch.equal(y, x * torch.sigmoid(x))
