"""Concurrency: several threads under eagerdecomp give each thread what it gets alone, natively.

Every thread owns its tensors, model, optimizer and generator; only eagerdecomp's
process-wide state (kernel cache, tables, warning and log filters) is shared. The
workload mixes pointwise ops, reductions, views, in-place and out= ops, random
fills from per-thread generators, backward and optimizer steps, at shapes that
change every iteration, from a fresh cache, so traces of one thread overlap
replays and traces of the others.

``make stress`` runs the same with more runs and threads (EAGERDECOMP_STRESS_RUNS,
EAGERDECOMP_STRESS_THREADS).
"""

import gc
import multiprocessing
import os
import sys
import threading
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.decompositions.table import default_table
from eagerdecomp.runtime.cache import KernelCache
from eagerdecomp.runtime.core import Runtime

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten
try:  # before any backward pass: the autograd engine learns devices at its first one
    from eagerdecomp.device.refdev import reference_device

    REF_DEV = reference_device()
except ed.BackendError as e:
    REF_DEV = e

RUNS = int(os.environ.get("EAGERDECOMP_STRESS_RUNS", "3"))
THREADS = int(os.environ.get("EAGERDECOMP_STRESS_THREADS", "4"))
ITERS = 8

# core ATen plus the generator overloads of rand/randn: a backend with its own Generator
RANDOM_OPSET = ed.OpSet(ed.OpSet.preset("core_aten").ops | {aten.rand.generator, aten.randn.generator}, name="core+gen")


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    steps = []
    for _ in range(ITERS):
        n, k = 3 + int(torch.randint(0, 6, (), generator=g)), 2 + int(torch.randint(0, 5, (), generator=g))
        steps.append((r(n, k), r(n, k), r(n + 5, 16), r(n, k)))
    params = [r(32, 16) * 0.3, r(32) * 0.3, r(32), r(32) * 0.1, r(4, 32) * 0.3, r(4) * 0.3]
    return params, steps


def _work(seed: int, data, device="cpu") -> list:
    """The per-thread workload: every result it produces, in order."""
    params, steps = data
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for a, b, x, y in steps:
        a, b, x, y = a.to(device), b.to(device), x.to(device), y.to(device)
        out += [
            F.silu(a),
            F.hardswish(b),
            torch.logaddexp(a, b),
            torch.lerp(a, b, 0.3),
            F.elu(a),
            F.softplus(a, beta=2.0),
        ]
        out += [a.logsumexp(-1), torch.var_mean(a, 0)[0], a.norm(dim=1), a.std(), F.log_softmax(a, -1), a.cumsum(0)]
        out += [a.t().contiguous(), *a.unbind(0), *a.split(2, 1), a.narrow(0, 1, 2), a.diagonal(), a[1:].flip(0)]
        c = a.clone()
        c.mul_(1.5).addcmul_(b, b, value=0.25).clamp_(-1, 1)
        c.t_()
        o1, o2 = torch.empty(0, device=device), torch.empty(a.shape, device=device)
        torch.add(a, b, alpha=2, out=o1)
        torch.sigmoid(a, out=o2)
        out += [c, o1, o2]
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        yg = y.clone().requires_grad_()
        (F.gelu(yg) * F.silu(yg)).pow(2).mean().backward()
        out += [loss.detach(), yg.grad]
    out += [p.detach() for p in model.parameters()]
    return [(t.stride(), t.cpu()) for t in out]  # strides as the device made them


def _random_work(seed: int) -> list:
    """Random fills from a per-thread generator: each thread's stream is its own."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(ITERS):
        t = torch.empty(3 + i, 4)
        out += [
            t.normal_(0.5, 2.0, generator=g).clone(),
            t.uniform_(-1, 3, generator=g).clone(),
            torch.rand(5, generator=g),
        ]
    return [(t.stride(), t) for t in out]


def _assert_same(want: list, got: list, who: str) -> None:
    assert len(want) == len(got), who
    for i, ((ws, w), (os_, o)) in enumerate(zip(want, got)):
        assert (w.shape, ws, w.dtype) == (o.shape, os_, o.dtype), f"{who}: result {i}"
        torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-5, msg=lambda m: f"{who}: result {i}: {m}")


def _run_threads(target, n: int) -> dict:
    results, errors = {}, []
    start = threading.Barrier(n)

    def body(i):
        try:
            start.wait()
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported below, with the thread
            errors.append((i, e))

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise AssertionError(f"thread {errors[0][0]} raised") from errors[0][1]
    return results


def _process_state():
    return (list(warnings.filters), warnings.showwarning, getattr(warnings, "_showwarnmsg_impl", None))


def _state_intact(before) -> None:
    """Tracing in threads must leave the process's warning machinery and logs as they were
    (a warnings.catch_warnings per trace restores another thread's state and swallows every
    later warning of the process)."""
    filters, show, impl = _process_state()
    ours = [f for f in filters if type(f[1]).__name__ == "_WhileTracing"]
    assert [f for f in filters if f not in ours] == [f for f in before[0] if f not in ours]
    assert (show, impl) == before[1:]
    assert not __import__("logging").getLogger("torch._subclasses.fake_tensor").disabled
    with pytest.warns(UserWarning, match="still heard"):
        warnings.warn("still heard", stacklevel=2)


@pytest.mark.parametrize("run", range(RUNS))
def test_threads_under_the_mode_match_native_alone(run):
    data = {i: _inputs(100 * run + i) for i in range(THREADS)}
    want = {i: _work(i, data[i]) for i in range(THREADS)}
    ed.cache_clear()
    before = _process_state()

    def under_mode(i):
        with ed.EagerDecompMode("core_aten"):
            return _work(i, data[i])

    got = _run_threads(under_mode, THREADS)
    for i in range(THREADS):
        _assert_same(want[i], got[i], f"thread {i}")
    _state_intact(before)


@pytest.mark.parametrize("run", range(RUNS))
def test_random_streams_stay_per_thread(run):
    want = {i: _random_work(run * 10 + i) for i in range(THREADS)}

    def under_mode(i):
        with ed.EagerDecompMode(RANDOM_OPSET):
            return _random_work(run * 10 + i)

    got = _run_threads(under_mode, THREADS)
    for i in range(THREADS):
        _assert_same(want[i], got[i], f"thread {i}")


def test_explicit_generators_draw_their_own_streams_from_threads():
    # under core_aten a generator's state is lent to the default generator for each draw, one
    # lending at a time: every thread gets its generator's numbers, the default one is left alone
    def draw(i):
        g = torch.Generator().manual_seed(i)
        out = [torch.empty(40).normal_(generator=g) for _ in range(3)] + [torch.randperm(9, generator=g)]
        return [(o.stride(), o) for o in out + [torch.rand(3, generator=g)]]

    want = {i: draw(i) for i in range(THREADS)}
    before = torch.default_generator.get_state()

    def call(i):
        with ed.EagerDecompMode("core_aten"):
            return draw(i)

    got = _run_threads(call, THREADS)
    assert torch.equal(torch.default_generator.get_state(), before)
    for i in range(THREADS):
        _assert_same(want[i], got[i], f"thread {i}")
        assert all(torch.equal(w, o) for (_, w), (_, o) in zip(want[i], got[i])), f"thread {i}: not eager's bits"


def test_one_trace_while_others_wait_and_replay():
    x = {i: torch.randn(13, 7) for i in range(THREADS)}
    ed.cache_clear()
    modes = {}

    def call(i):
        with ed.EagerDecompMode("core_aten") as modes[i]:
            return [torch.ops.aten.mish.default(x[i]) for _ in range(5)]

    got = _run_threads(call, THREADS)
    rows = [modes[i].report().row(aten.mish.default) for i in range(THREADS)]
    assert sum(r.traces for r in rows) == 1  # one thread traced; the rest replayed its kernel
    assert sum(r.hits for r in rows) == 5 * THREADS - 1
    for i in range(THREADS):
        _assert_same([(y.stride(), y) for y in [F.mish(x[i])] * 5], [(y.stride(), y) for y in got[i]], f"thread {i}")


def test_device_switch_from_threads_and_autograd_threads():
    if isinstance(REF_DEV, Exception):  # no compiler here
        pytest.skip(f"reference device unavailable: {REF_DEV}")
    dev = REF_DEV
    # edref tensors' backward runs on autograd's device thread, shared by every caller
    data = {i: _inputs(7 + i) for i in range(THREADS)}
    want = {i: _work(i, data[i]) for i in range(THREADS)}
    ed.cache_clear()
    ed.disable(dev.type)
    ed.enable(dev.type)
    try:
        got = _run_threads(lambda i: _work(i, data[i], dev), THREADS)
    finally:
        ed.disable(dev.type)
    for i in range(THREADS):
        _assert_same(want[i], got[i], f"thread {i}")


def _child(conn, x):
    with ed.EagerDecompMode("core_aten") as mode:
        y = F.mish(x)
    conn.send((y.tolist(), mode.report().row(aten.mish.default).hits))  # plain data: no shared-memory handles
    conn.close()


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forked_child_after_a_warm_cache():
    x = torch.randn(9, 4)
    with ed.EagerDecompMode("core_aten"):
        F.mish(x)  # warm
    # a thread hammering the cache while we fork: its lock may be held at that instant
    stop = threading.Event()

    def hammer():
        with ed.EagerDecompMode("core_aten"):
            while not stop.is_set():
                F.mish(x)

    t = threading.Thread(target=hammer)
    t.start()
    try:
        ctx = multiprocessing.get_context("fork")
        for _ in range(3):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(send, x))
            p.start()
            assert recv.poll(120), "the forked child hung"
            y, hits = recv.recv()
            p.join(30)
            assert p.exitcode == 0
            torch.testing.assert_close(torch.tensor(y), F.mish(x))
            assert hits == 1  # the child replayed the parent's kernel
    finally:
        stop.set()
        t.join()


def test_dataloader_fork_workers_decompose():
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            with ed.EagerDecompMode("core_aten"):
                return F.mish(torch.arange(i + 1, dtype=torch.float32))

    with ed.EagerDecompMode("core_aten"):
        F.mish(torch.arange(3, dtype=torch.float32))  # warm one key before forking
    loader = torch.utils.data.DataLoader(
        Squares(), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120
    )
    got = list(loader)
    for i, y in enumerate(got):
        torch.testing.assert_close(y, F.mish(torch.arange(i + 1, dtype=torch.float32)))


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_interrupted_trace_leaves_no_entry(error):
    raised = []

    def once(x):
        if not raised:
            raised.append(1)
            raise error("interrupted mid-trace")
        return x * torch.tanh(F.softplus(x))

    x = torch.randn(6)
    mode = ed.EagerDecompMode("core_aten", decompositions={aten.mish.default: once})
    with pytest.raises(error), mode:
        aten.mish.default(x)
    assert len(mode.runtime.cache) == 0 and not mode.runtime.cache._flights
    with mode:
        y = aten.mish.default(x)
    torch.testing.assert_close(y, F.mish(x))
    assert len(mode.runtime.cache) == 1


def test_cache_bound_and_flat_memory_over_many_shapes(monkeypatch):
    # exact-shape kernels only: a shape family would keep one kernel for all these shapes
    # (tests/runtime/test_family.py checks the family table's bound)
    monkeypatch.setenv("EAGERDECOMP_SHAPE_GENERIC", "0")
    opset = ed.OpSet.preset("core_aten")
    cache = KernelCache(maxsize=32)
    runtime = Runtime(opset, default_table(opset), cache)
    kernels = []

    def call(n):
        x = torch.randn(n)
        runtime(aten.mish.default, (x,), {})

    for n in range(1, 101):
        call(n)
        if n == 1:
            kernels.append(weakref.ref(next(iter(cache._lru.values())).module))
    assert len(cache) == 32
    gc.collect()
    assert kernels[0]() is None  # an evicted kernel is freed, not kept by anything of ours or FX's
    import tracemalloc

    tracemalloc.start()
    for n in range(101, 201):
        call(n)
    gc.collect()
    first = tracemalloc.get_traced_memory()[0]
    for n in range(201, 601):
        call(n)
    gc.collect()
    last = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # 400 more distinct shapes, each traced and evicted: the heap may move by noise only
    assert last - first < 2_000_000, f"heap grew by {last - first} bytes over 400 evicted kernels"
    assert len(cache) == 32
