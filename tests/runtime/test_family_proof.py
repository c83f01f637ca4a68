"""Proved shape families (eagerdecomp.family, trace._unproven, symbolic.unguarded): a member
whose trace proves it eager-exact for every shape its guard admits answers new exact keys
with no meta kernel run; the rest are checked per key, with the reason in the report.

The proof is tested the way it is used: each case is traced at one set of shapes, then
called with each size of each input changed alone (one at a time), under
``EAGERDECOMP_AUDIT_PROOFS=1`` (a proved member that eager's meta kernel contradicts is an
error) and without it, against native eager: values, dtypes, shapes, strides, offsets,
aliasing and eager's refusals.
"""

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

import eagerdecomp as ed
from eagerdecomp.errors import MismatchError
from eagerdecomp.runtime import cache as cache_module
from eagerdecomp.runtime import core, hits, trace
from eagerdecomp.runtime.symbolic import new_shape_env, symbolic_layout, unguarded

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

aten = torch.ops.aten

SIZES = {"a": 4, "b": 5, "c": 3}

# name -> (fn of the inputs, their shapes as letters of SIZES, "1" a size of 1): decomposed
# under core_aten, each with shape families. (Broadcasting calls of addcmul, lerp... keep
# exact-shape kernels: their meta kernels fail over symbolic sizes in torch 2.13.)
CASES = {
    "gelu_backward": (lambda g, x: aten.gelu_backward(g, x), ["ab", "ab"]),
    "tanh_backward": (lambda g, y: aten.tanh_backward(g, y), ["cab", "cab"]),
    "addcmul": (lambda a, b, c: torch.addcmul(a, b, c, value=0.5), ["ab", "ab", "ab"]),
    "addcdiv_": (lambda a, b, c: a.clone().addcdiv_(b, c.abs() + 1), ["ab", "ab", "ab"]),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.25), ["cab", "cab"]),
    "log_softmax_backward": (lambda g, y: aten._log_softmax_backward_data(g, y, 1, torch.float32), ["ab", "ab"]),
    "nll_loss": (lambda x: aten.nll_loss_forward(x.log_softmax(1), (x[:, 0] > 0).long(), None, 1, -100), ["ab"]),
    "select_backward": (lambda g: aten.select_backward(g, [g.shape[0], 3, g.shape[1]], 1, 2), ["ab"]),
    "transpose": (lambda x: x.transpose(0, 2), ["cab"]),
    "t_of_slice": (lambda x: x[1:].t(), ["ab"]),
    "std": (lambda x: torch.std(x, 1), ["ab"]),
    # NOTE: roll's decomposition asks statically_known_true(size == sys.maxsize): checked per key
    "roll": (lambda x: torch.roll(x, 2, 1), ["ab"]),
    "tril": (lambda x: torch.tril(x, 1), ["ab"]),
}


UNPROVED = {"roll": "aten.roll.default"}


def _shapes(letters, sizes):
    return [[1 if ch == "1" else sizes[ch] for ch in s] for s in letters]


def _variants(letters):
    """The base shapes; each size (letter) changed alone, in every input it sizes; then each
    dimension of each input changed alone (eager mostly refuses those: so must we)."""
    yield _shapes(letters, SIZES)
    for ch in sorted({c for s in letters for c in s} - {"1"}):
        yield _shapes(letters, SIZES | {ch: SIZES[ch] + 3})
    for i, s in enumerate(letters):
        for d in range(len(s)):
            shapes = _shapes(letters, SIZES)
            shapes[i][d] += 3
            yield shapes


def _outcome(fn, shapes, seed):
    torch.manual_seed(seed)
    inputs = [torch.randn(s) for s in shapes]
    try:
        return inputs, fn(*inputs), None
    except Exception as e:  # noqa: BLE001 - eager's refusal is part of what is compared
        return inputs, None, e


def _same(got, ref, inputs):
    if isinstance(ref, (tuple, list)):
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            _same(g, r, inputs)
        return
    assert (got.dtype, got.shape) == (ref.dtype, ref.shape)
    assert all(n <= 1 or a == b for n, a, b in zip(ref.shape, got.stride(), ref.stride())), (got.stride(), ref.stride())
    assert got.storage_offset() == ref.storage_offset()
    shares = [got.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in inputs]
    assert any(shares) == (got._base is not None or ref._base is not None and any(shares))
    torch.testing.assert_close(got, ref, equal_nan=True)


@pytest.mark.parametrize("audit", [False, True], ids=["proved", "audited"])
@pytest.mark.parametrize("name", list(CASES))
def test_each_size_changed_alone_matches_eager(name, audit, monkeypatch):
    if audit:
        monkeypatch.setenv("EAGERDECOMP_AUDIT_PROOFS", "1")
    fn, base = CASES[name]
    ed.cache_clear()
    mode = ed.EagerDecompMode("core_aten")
    for seed, shapes in enumerate(_variants(base)):
        _, ref, refused = _outcome(fn, shapes, seed)
        for _ in range(2):  # a new exact key, then its program (patched from the family's) on a hit
            with mode:
                inputs, got, error = _outcome(fn, shapes, seed)
            if refused is not None:
                assert error is not None and type(error) is type(refused), (shapes, refused, error)
                continue
            if error is not None and _meta_refuses(fn, shapes):
                continue  # NOTE: eager's CPU kernel skips a check its meta kernel makes: we refuse with it
            assert error is None, (shapes, error)
            _same(got, ref, inputs)
    report = mode.report()
    assert sum(row.family for row in report.decomposed) > 0, report  # new keys answered by families
    if hits.enabled():  # the second call of each new key: its patched program, in C++
        assert sum(row.cpp_hits for row in report.decomposed) > 0, report
    unproven = {row.op for row in report.decomposed if row.per_key_checks}
    assert unproven == ({UNPROVED[name]} if name in UNPROVED else set()), report


def _meta_refuses(fn, shapes) -> bool:
    try:
        fn(*[torch.empty(s, device="meta") for s in shapes])
    except Exception:  # noqa: BLE001
        return True
    return False


def _counting_reference(monkeypatch) -> list:
    calls = []
    real = core.reference

    def counted(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(core, "reference", counted)
    return calls


def test_a_proved_family_runs_no_meta_kernel_for_a_new_key(monkeypatch):
    ed.cache_clear()
    calls = _counting_reference(monkeypatch)
    with ed.EagerDecompMode("core_aten") as mode:
        for n in (5, 7, 9, 11):
            x = torch.randn(n, 6)
            torch.testing.assert_close(aten.gelu_backward(x, x), aten.gelu_backward.default(x, x))
    assert calls.count(aten.gelu_backward.default) == 1  # the trace's own check at n = 5, none after
    assert mode.report().row(aten.gelu_backward.default).family == 3


def test_an_unguarded_decision_keeps_per_key_checks(monkeypatch):
    """A meta kernel that asks ``statically_known_true`` of a size cannot be proved: it is
    checked against eager's meta kernel at every new exact key, and the report says why."""
    real = trace.reference

    def asks(func, args, kwargs, mode=None, fakes=None, refuse=False):
        if fakes:
            statically_known_true(fakes[0].shape[0] == 7)  # undecided over symbols
        return real(func, args, kwargs, mode, fakes, refuse)

    monkeypatch.setattr(trace, "reference", asks)
    ed.cache_clear()
    calls = _counting_reference(monkeypatch)
    with ed.EagerDecompMode("core_aten") as mode:
        for n in (5, 7, 9):
            x = torch.randn(n, 6)
            torch.testing.assert_close(aten.gelu_backward(x, x), aten.gelu_backward.default(x, x))
    assert calls.count(aten.gelu_backward.default) == 3
    (why,) = mode.report().row(aten.gelu_backward.default).per_key_checks
    assert "without a guard" in why and "checked per shape" in str(mode.report())


def test_unguarded_records_only_undecided_queries_of_its_own_env():
    env, other = new_shape_env(), new_shape_env()
    (a, _, _), (b, _, _) = symbolic_layout(env, [(0, torch.ones(3)), (1, torch.ones(5))])
    (c, _, _), (d, _, _) = symbolic_layout(other, [(0, torch.ones(3)), (1, torch.ones(5))])
    with unguarded(env) as notes:
        assert statically_known_true(a[0] >= 2)  # decided: symbols are sizes >= 2
        assert not statically_known_true(a[0] == b[0])  # false here, true at other sizes
        assert not statically_known_true(a[0] < b[0])  # true here, not known
        statically_known_true(c[0] == d[0])  # another env's: not ours to note
    assert [str(e) for e in notes] == [str(a[0] == b[0]), str(a[0] < b[0])]
    statically_known_true(a[0] == b[0])
    assert len(notes) == 2  # nothing is noted outside the block


def _tamper(op) -> None:
    """Make every member of ``op``'s families claim a wrong output shape, still proved."""
    from dataclasses import replace

    from eagerdecomp.runtime.family import Family

    for cache in cache_module._CACHES.values():
        for fkey, family in list(cache._families.items()):
            if fkey.parts[1] is op and family.members:
                bad = []
                for m in family.members:
                    (shape, stride, offset), *rest = m.metas
                    bad.append(replace(m, metas=((shape[:-1] + (99,), stride, offset), *rest), unproven=None))
                cache._families[fkey] = Family(tuple(bad))


def test_audit_turns_a_false_proof_into_an_error(monkeypatch):
    ed.cache_clear()
    op = aten.gelu_backward.default
    with ed.EagerDecompMode("core_aten"):
        x = torch.randn(5, 6)
        aten.gelu_backward(x, x)
    _tamper(op)
    monkeypatch.setenv("EAGERDECOMP_AUDIT_PROOFS", "1")
    with pytest.raises(MismatchError, match="proved eager-exact"), ed.EagerDecompMode("core_aten"):
        x = torch.randn(7, 6)
        aten.gelu_backward(x, x)


def test_without_audit_a_wrong_layout_is_still_caught_at_replay():
    """The replay check compares what the kernel returned with the member's layout: a false
    claim costs the family, never the answer."""
    ed.cache_clear()
    op = aten.gelu_backward.default
    with ed.EagerDecompMode("core_aten") as mode:
        x = torch.randn(5, 6)
        aten.gelu_backward(x, x)
    _tamper(op)
    with ed.EagerDecompMode("core_aten") as mode:
        x = torch.randn(7, 6)
        got = aten.gelu_backward(x, x)
    torch.testing.assert_close(got, op(x, x))
    assert "replayed layout differed" in " ".join(mode.report().row(op).exact_shapes)


def test_a_proved_familys_new_keys_neither_read_nor_write_the_disk(tmp_path, monkeypatch):
    """With the disk cache on, a new exact key a proved family in memory answers costs no disk
    lookup and leaves no entry: the family answers it in any process."""
    from eagerdecomp.runtime import disk

    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EAGERDECOMP_DISK_CACHE", "1")
    ed.cache_clear()
    looked = []
    real = disk.Store.load_kernel
    monkeypatch.setattr(disk.Store, "load_kernel", lambda self, key: looked.append(key) or real(self, key))
    op = aten.gelu_backward.default
    with ed.EagerDecompMode("core_aten") as mode:
        x = torch.randn(5, 6)
        op(x, x)  # traced: its family, its key and its program are written
        disk._write_pending()
        written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        looked.clear()
        xs = [torch.randn(n, 6) for n in (7, 9, 11)]
        got = [op(x, x) for x in xs]
    for x, y in zip(xs, got):
        torch.testing.assert_close(y, op(x, x))
    assert looked == [] and mode.report().row(op).family == 3
    disk._write_pending()
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == written
    ed.cache_clear()
