"""The persistent kernel cache (eagerdecomp.disk): a new process loads instead of tracing;
unreadable entries are ignored with one warning and rebuilt; concurrent writers leave a
valid cache; cache_clear(disk=True); the switch; user decompositions are not persisted."""

import itertools
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.decompositions import registry
from eagerdecomp.runtime import disk, hits
from tests.compare import assert_like_eager

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten

# one process's work: decomposed ops at two lengths (shape families and exact kernels), on
# transposed and permuted inputs too; prints "traces loaded family" summed over the report, and
# saves the inputs, the mode's outputs and native eager's (torch.save keeps strides and storages)
SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    import eagerdecomp as ed

    def work(x):
        n = x.shape[0]
        return [
            F.mish(x), torch.logsumexp(x, 1), F.silu(x.t()), F.mish(x.view(n, 2, 3).permute(2, 0, 1)),
            *torch.split(x, 2, 0), F.cross_entropy(x, torch.zeros(n, dtype=torch.long)),
        ]

    torch.manual_seed(0)
    xs = [torch.randn(n, 6) for n in (5, 9)]
    native = [work(x) for x in xs]
    with ed.EagerDecompMode("core_aten") as mode:
        ours = [work(x) for x in xs]
    rows = mode.report().rows
    traces, loaded, family = (sum(getattr(r, k) for r in rows) for k in ("traces", "loaded", "family"))
    print(traces, loaded, family, ed.cache_info().preloaded)
    torch.save({"inputs": xs, "native": native, "mode": ours}, sys.argv[1])
    """
)


@pytest.fixture
def no_user_decompositions():
    """The user table empty for the test, then restored. NOTE: other test modules register user
    decompositions for the whole session (test_custom_ops), and a runtime whose table holds any
    is not persisted, by design; the version moves both ways so no runtime built from the other
    table is reused."""
    saved = dict(registry.USER)
    with registry._lock:
        registry.USER.clear()
        registry._version = next(registry._versions)
    yield
    with registry._lock:
        registry.USER.update(saved)
        registry._version = next(registry._versions)


@pytest.fixture
def on_disk(tmp_path, monkeypatch, no_user_decompositions):
    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EAGERDECOMP_DISK_CACHE", "1")
    monkeypatch.setattr(disk, "_warned", type(disk._warned)())
    ed.cache_clear()
    yield tmp_path
    ed.cache_clear()


def _run(env_dir, extra_env=None, script=SCRIPT):
    """One process's counts, its results under the mode (checked against native eager's in the same
    process: values to rounding, dtypes, shapes, strides, aliasing of split's views), and stderr."""
    env = dict(os.environ, EAGERDECOMP_CACHE_DIR=str(env_dir), EAGERDECOMP_DISK_CACHE="1")
    env.update(extra_env or {})
    saved = env_dir.parent / f"{env_dir.name}-results-{next(_RUNS)}.pt"
    out = subprocess.run(
        [sys.executable, "-c", script, str(saved)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counts = out.stdout.strip().splitlines()[-1]
    results = torch.load(saved)
    for x, want, got in zip(results["inputs"], results["native"], results["mode"]):
        assert_like_eager(want, got, exact=False, inputs=[x])
    return tuple(map(int, counts.split())), results["mode"], out.stderr


_RUNS = itertools.count()


def _entries(root):
    return sorted(p for p in root.rglob("*.pkl") if not p.name.startswith(".tmp-"))


@pytest.fixture
def kernels_only(monkeypatch):
    """No C++ programs from disk: a miss loads the kernel file (the path these tests check)."""
    monkeypatch.setattr(hits, "preload", lambda runtime: 0)


def test_a_second_process_loads_instead_of_tracing(tmp_path):
    (traces1, loaded1, _, preloaded1), results1, _ = _run(tmp_path)
    assert traces1 > 0 and loaded1 == 0 and preloaded1 == 0
    (traces2, loaded2, family2, preloaded2), results2, err = _run(tmp_path)
    assert traces2 == 0
    if hits.enabled():  # the first process's C++ programs are installed before the first miss
        assert preloaded2 > 0
    else:
        assert loaded2 > 0 and preloaded2 == 0
    assert_like_eager(results1, results2)  # the loaded kernels are the traced ones: bit for bit
    assert "unreadable" not in err


def test_the_kernels_load_when_programs_do_not(tmp_path):
    (traces, loaded, _, preloaded), results1, _ = _run(tmp_path, {"EAGERDECOMP_NO_EXT": "1"})
    assert traces > 0 and preloaded == 0
    (traces, loaded, _, preloaded), results2, _ = _run(tmp_path, {"EAGERDECOMP_NO_EXT": "1"})
    assert traces == 0 and loaded > 0
    assert_like_eager(results1, results2)


# calls with arguments at their defaults: left out by Python's dispatch, on the stack of the
# C++ key; a float default (huber_loss's delta, celu's alpha) and the same float given
DEFAULTED = SCRIPT.replace(
    "F.mish(x), torch.logsumexp(x, 1), F.silu(x.t()), F.mish(x.view(n, 2, 3).permute(2, 0, 1)),",
    "F.huber_loss(x, x.flip(0)), F.huber_loss(x, x.flip(0), delta=0.5), F.smooth_l1_loss(x, x.flip(0)), "
    "F.celu(x), F.celu(x, alpha=2.0), torch.zeros_like(x.t()), x.clone().add_(x.flip(0)), "
    "torch.logsumexp(x, 1), F.celu(x), F.huber_loss(x, x.flip(0), delta=0.5),",  # (again: C++ hits)
)


@pytest.mark.skipif(not hits.enabled(), reason="one path only without the C++ library")
@pytest.mark.parametrize("first, second", [("0", "1"), ("1", "0")], ids=["python-then-key", "key-then-python"])
def test_a_kernel_written_on_one_path_serves_the_other(tmp_path, first, second):
    """The C++ key hands Python a call as Python's dispatch does (defaults left out), so both
    paths key it alike: the second process, on the other path, traces nothing."""
    assert DEFAULTED != SCRIPT  # (the replaced line is there)
    (traces, _, _, _), results1, _ = _run(tmp_path, {"EAGERDECOMP_KEY_MODE": first}, DEFAULTED)
    assert traces > 0
    (traces, loaded, _, preloaded), results2, _ = _run(tmp_path, {"EAGERDECOMP_KEY_MODE": second}, DEFAULTED)
    assert traces == 0 and loaded + preloaded > 0
    assert_like_eager(results1, results2)  # the same kernels: bit for bit


def test_switched_off_writes_nothing(tmp_path):
    (traces, loaded, _, _), _, _ = _run(tmp_path, {"EAGERDECOMP_DISK_CACHE": "0"})
    assert traces > 0 and loaded == 0
    assert not _entries(tmp_path)


def _work():
    with ed.EagerDecompMode("core_aten") as mode:
        xs = [torch.randn(n, 4) for n in (3, 7)]
        ys = [F.mish(x) for x in xs]
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y, F.mish(x))
    return mode.report().row(aten.mish.default)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "stale format", "empty"])
def test_an_unreadable_entry_warns_once_and_is_rebuilt(on_disk, kernels_only, damage):
    first = _work()
    assert first.traces >= 1
    entries = _entries(on_disk)
    assert entries
    for p in entries:
        data = p.read_bytes()
        if damage == "garbage":
            p.write_bytes(b"not a pickle" * 10)
        elif damage == "truncated":
            p.write_bytes(data[: len(data) // 2])
        elif damage == "empty":
            p.write_bytes(b"")
        else:
            import pickle

            entry = pickle.loads(data)
            entry["format"] = -1
            p.write_bytes(pickle.dumps(entry))
    ed.cache_clear()  # memory only: the next calls read the damaged entries
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _work()
    unreadable = [w for w in caught if "unreadable kernel cache entry" in str(w.message)]
    assert len(unreadable) == 1, [str(w.message) for w in caught]
    assert again.traces >= 1 and again.loaded == 0  # rebuilt by tracing
    ed.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third = _work()
    assert not [w for w in caught if "unreadable" in str(w.message)]
    assert third.traces == 0 and third.loaded >= 1  # the rebuilt entries are whole


def test_cache_clear_disk_removes_the_entries(on_disk):
    _work()
    assert _entries(on_disk)
    ed.cache_clear(disk=True)
    assert not _entries(on_disk)
    row = _work()
    assert row.traces >= 1 and row.loaded == 0


def test_user_decompositions_are_not_persisted(on_disk):
    def mine(x):
        return x * torch.tanh(F.softplus(x))

    with ed.EagerDecompMode("core_aten", decompositions={aten.mish.default: mine}):
        F.mish(torch.randn(4))
    assert not _entries(on_disk)
    assert disk.store_for(ed.OpSet.coerce("core_aten"), {aten.mish.default: mine}) is None


def test_the_fingerprint_separates_opsets(on_disk):
    a = disk.store_for(ed.OpSet.coerce("core_aten"), {})
    b = disk.store_for(ed.OpSet.coerce("prims"), {})
    assert a.folder != b.folder and a.folder.parent == b.folder.parent


WRITER = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import eagerdecomp as ed
    with ed.EagerDecompMode("core_aten"):
        for i in range(30):
            ed.cache_clear()  # memory only: every round writes its entries to disk again
            for n in (3, 5, 8):
                x = torch.randn(n, 4)
                F.mish(x); torch.logsumexp(x, 1); F.silu(x)
    """
)


def test_concurrent_writers_leave_a_valid_cache(tmp_path):
    env = dict(os.environ, EAGERDECOMP_CACHE_DIR=str(tmp_path), EAGERDECOMP_DISK_CACHE="1")
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER], env=env, stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert "unreadable" not in err
    assert not list(tmp_path.rglob(".tmp-*"))  # no temporary file left behind
    import pickle

    for p in _entries(tmp_path):
        entry = pickle.loads(p.read_bytes())
        assert entry["format"] == disk.FORMAT
    _, _, err = _run(tmp_path)
    assert "unreadable" not in err


def test_fork_child_uses_the_store(on_disk, kernels_only):
    import multiprocessing as mp

    _work()  # writes entries; the store's lock exists in the parent
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        ed.cache_clear()
        row = _work()
        q.put((row.traces, row.loaded))

    p = ctx.Process(target=child)
    p.start()
    p.join(120)
    assert p.exitcode == 0
    traces, loaded = q.get(timeout=5)
    assert traces == 0 and loaded >= 1


# -- the C++ hit path's programs on disk (eagerdecomp.runtime.hits.preload) ----------------------------
needs_native = pytest.mark.skipif(not hits.enabled(), reason="the C++ hit path is not built")


def _lerp_and_silu(weight):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    with ed.EagerDecompMode("core_aten") as mode:
        out = (torch.lerp(x, y, weight), F.silu(x.t()))
    # (the decompositions round differently from the fused native kernels)
    torch.testing.assert_close(out[0], torch.lerp(x, y, weight))
    torch.testing.assert_close(out[1], F.silu(x.t()))
    assert out[1].stride() == F.silu(x.t()).stride()
    return out, mode.report()


@needs_native
def test_programs_are_installed_before_the_first_miss(on_disk):
    expected, _ = _lerp_and_silu(0.2)  # what the traced kernels give at 0.2
    ed.cache_clear(disk=True)
    _, first = _lerp_and_silu(0.3)
    assert first.row(aten.silu.default).traces == 1
    ed.cache_clear()  # memory only: as a new process would start
    out, again = _lerp_and_silu(0.2)  # the lifted weight: the program made at 0.3, another value
    assert ed.cache_info().preloaded >= 2
    for op in (aten.silu.default, aten.lerp.Scalar):
        row = again.row(op)
        assert row.traces == 0 and row.loaded == 0 and row.cpp_hits == 1, row
    for a, b in zip(out, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_native
def test_programs_of_another_build_are_not_read(on_disk, monkeypatch):
    _lerp_and_silu(0.3)
    monkeypatch.setattr(hits, "_library", lambda: "w0-another-build")
    ed.cache_clear()
    _, again = _lerp_and_silu(0.3)
    assert ed.cache_info().preloaded == 0
    assert again.row(aten.silu.default).loaded == 1  # its kernel file, not a program


@needs_native
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_pack_warns_once_and_is_rebuilt(on_disk, damage):
    _lerp_and_silu(0.3)
    for store in list(disk._STORES):
        store.pack_programs()  # what exit does
    (pack,) = on_disk.rglob("pack")
    data = pack.read_bytes()
    pack.write_bytes(b"not a pickle" * 10 if damage == "garbage" else data[: len(data) // 2])
    ed.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, again = _lerp_and_silu(0.3)
    assert len([w for w in caught if "unreadable" in str(w.message)]) == 1
    assert ed.cache_info().preloaded == 0 and not pack.exists()
    assert again.row(aten.silu.default).traces == 0  # its kernel file is whole


@needs_native
def test_the_device_switch_preloads_its_programs(on_disk):
    from eagerdecomp.device.refdev import reference_device

    dev = reference_device()
    x = torch.randn(4, 3)

    def run():
        ed.enable(dev)
        try:
            out = F.silu(x.to(dev)).cpu()
            return out, ed.device.enabled(dev).report().row(aten.silu.default)
        finally:
            ed.disable(dev)

    out, row = run()
    assert row.traces == 1
    ed.cache_clear()
    out2, row2 = run()
    torch.testing.assert_close(out2, out, rtol=0, atol=0)  # the traced kernel's answer, bit for bit
    assert ed.cache_info().preloaded >= 1
    # the first call is a Python miss that reads the disk (installing the programs), the next a C++ hit
    assert row2.traces == 0


def test_the_cache_is_bounded_keeping_the_newest(on_disk):
    store = disk.store_for(ed.OpSet.coerce("core_aten"), {})
    for i in range(12):
        store._write(f"entry {i}", "key", lambda: "kernel id")
        os.utime(store._path(f"entry {i}"), ns=(i * 10**9, i * 10**9))  # written one second apart
    assert store.prune(limit=12) == 0
    assert store.prune(limit=8) == 6  # down to 3/4 of the limit
    kept = {p.name for p in store.folder.glob("*.pkl")}
    assert kept == {store._path(f"entry {i}").name for i in range(6, 12)}
    assert store._read("entry 11", "key") == "kernel id" and store._read("entry 0", "key") is None


def test_a_pruned_entry_is_traced_again(on_disk, kernels_only):
    _work()
    store = disk.store_for(ed.OpSet.coerce("core_aten"), {})
    assert store.prune(limit=0) > 0 and not list(store.folder.glob("*.pkl"))
    ed.cache_clear()  # memory only: the disk has nothing left either
    row = _work()
    assert row.traces >= 1 and row.loaded == 0


@needs_native
def test_programs_are_written_in_batches_and_read_back_whole(on_disk, monkeypatch):
    monkeypatch.setattr(disk, "PROGRAM_BATCH", 2)
    # exact-shape kernels: a proved shape family's new keys write no program (its family answers them)
    monkeypatch.setenv("EAGERDECOMP_SHAPE_GENERIC", "0")
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 5, generator=g) for n in (3, 4, 6, 7, 9)]
    with ed.EagerDecompMode("core_aten"):
        for x in xs:
            F.silu(x)  # a new exact key each: a program each
    folder = next(on_disk.rglob("programs-*"))
    batches = sorted(folder.glob("batch-*.pkl"))
    assert len(batches) == 2  # four programs written two at a time; the fifth is still in memory
    import pickle

    assert all(pickle.loads(p.read_bytes())["kind"] == "programs" for p in batches)
    store = disk.store_for(ed.OpSet.coerce("core_aten"), {})
    lib = folder.name.removeprefix("programs-")
    assert len(store.load_programs(lib)) == 5  # the batches and the one not written yet
    disk._write_pending()  # as at exit
    assert len(sorted(folder.glob("batch-*.pkl"))) == 3 and not disk._PENDING
    ed.cache_clear()  # memory only: as a new process would start
    with ed.EagerDecompMode("core_aten") as mode:
        for x in xs:
            torch.testing.assert_close(F.silu(x), F.silu(x), rtol=0, atol=0)
    assert ed.cache_info().preloaded >= 5 and mode.report().row(aten.silu.default).traces == 0
    with ed.EagerDecompMode("core_aten"):
        F.silu(torch.randn(11, 5))  # pending again
    ed.cache_clear(disk=True)
    assert not disk._PENDING  # what the disk forgot is not written later


def test_a_length_never_seen_is_answered_by_the_family_on_disk_not_run_direct(on_disk, kernels_only, monkeypatch):
    # an earlier process traced a shape family (a length that changes every call) and wrote its
    # member; a fresh cache meets a length neither saw: the member on disk answers it (checked
    # against eager's meta kernel), no direct run and no trace, as its exact kernels would
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "0")  # (the first process: a family trace at once)
    with ed.EagerDecompMode("core_aten"):
        for n in (3, 5, 8):
            F.softplus(torch.randn(n, 4))
    ed.cache_clear()  # memory only: what is left is the disk's
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2")
    x = torch.randn(13, 4)
    with ed.EagerDecompMode("core_aten") as mode:
        got = F.softplus(x)
    row = mode.report().row(aten.softplus.default)
    assert (row.direct, row.traces, row.family) == (0, 0, 1), row
    assert_like_eager(F.softplus(x), got, exact=False, inputs=[x])  # (to rounding: the decomposition's ops)
