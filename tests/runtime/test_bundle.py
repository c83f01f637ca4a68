"""Kernel bundles (eagerdecomp.runtime.bundle, eagerdecomp.workloads): a bundle built from a
workload serves a fresh process with no trace and identical results; it is never written; a
stale, foreign or unreadable bundle is ignored with one warning; the command line builds one."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import bundle, disk, hits

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

# a tiny workload: decomposed ops (shape families, exact kernels, views) at the lengths given
WORK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import eagerdecomp as ed

    def work(opset, lengths):
        torch.manual_seed(0)
        total = 0.0
        with ed.EagerDecompMode(opset):
            for n in lengths:
                x = torch.randn(n, 6, requires_grad=True)
                y = F.mish(x).sum() + torch.logsumexp(x, 1).sum() + F.silu(x.t()).sum()
                y = y + sum(t.sum() for t in torch.split(x, 2, 0))
                y = y + F.cross_entropy(x, torch.zeros(n, dtype=torch.long))
                y.backward()
                total += float(y) + float(x.grad.sum())
        return total
    """
)

BUILD = WORK + textwrap.dedent(
    """
    import sys
    from eagerdecomp.workloads import Workload, build
    build(sys.argv[1], "core_aten", [Workload("tiny", lambda opset, dtype: work(opset, (5, 9)))], progress=print)
    """
)

# prints the kernels traced in the whole process, the programs preloaded, then the results
USE = WORK + textwrap.dedent(
    """
    import sys
    total = work("core_aten", [int(n) for n in sys.argv[1:]])
    print(ed.cache_info().traced, ed.cache_info().preloaded)
    print(repr(total))
    """
)


def _python(script, args, env):
    env = {k: v for k, v in os.environ.items() if k != "EAGERDECOMP_BUNDLE"} | env
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _use(tmp_path, lengths, bundle_dir=None, name="own"):
    # (every key traced at its first call: the counts compare traces, in every fixture's process)
    env = {"EAGERDECOMP_CACHE_DIR": str(tmp_path / name), "EAGERDECOMP_DISK_CACHE": "1", "EAGERDECOMP_TRACE_AFTER": "0"}
    if bundle_dir is not None:
        env["EAGERDECOMP_BUNDLE"] = str(bundle_dir)
    out = _python(USE, lengths, env)
    counts, total = out.stdout.strip().splitlines()[-2:]
    traced, preloaded = map(int, counts.split())
    return traced, preloaded, total, out.stderr


def _snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    _python(BUILD, [root / "b"], {"EAGERDECOMP_CACHE_DIR": str(root / "unused")})
    return root / "b"


# the lengths the bundle was built at, and one it never saw, answered by the shape families it
# holds (10: split's chunk count is 9's; a length with another count needs a kernel of its own)
LENGTHS = (5, 9, 10)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """The workload in a fresh process with no bundle."""
    return _use(tmp_path_factory.mktemp("cold"), LENGTHS)


def test_a_bundle_serves_a_fresh_process_without_tracing_and_is_never_written(built, cold, tmp_path):
    manifest = bundle.read_manifest(built)
    assert manifest["runs"][0]["traced"] > 0 and manifest["sources"] == disk.code_fingerprint()
    before = _snapshot(built)
    warm = _use(tmp_path, LENGTHS, built)
    assert cold[0] > 0 and warm[0] == 0, (cold, warm)
    if hits.enabled():  # the bundle's C++ programs were installed before the first miss
        assert warm[1] > 0
    assert warm[2] == cold[2]  # identical results
    assert "BundleWarning" not in warm[3]
    assert _snapshot(built) == before  # read only: nothing written, removed or packed there
    # (the process's own cache may stay empty: the new keys of a proved shape family are not
    # written anywhere, the family answers them in any process)


def test_a_stale_bundle_warns_once_and_is_ignored(built, cold, tmp_path):
    import shutil

    stale = tmp_path / "stale"
    shutil.copytree(built, stale)
    manifest = json.loads((stale / bundle.MANIFEST).read_text())
    manifest["sources"] = "0" * 64  # built from other eagerdecomp sources
    (stale / bundle.MANIFEST).write_text(json.dumps(manifest))
    # NOTE: its folders are named by the same fingerprint as ours, so only the manifest says it is stale
    traced, _, total, err = _use(tmp_path, LENGTHS, stale)
    assert traced == cold[0] and total == cold[2]
    assert err.count("BundleWarning") == 1 and "stale or foreign" in err


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(bundle, "_warned", set())
    bundle._manifest.cache_clear()


def _folders(opset="core_aten"):
    opset = OpSet.coerce(opset)
    return bundle.folders_for(disk.folder_name(opset), opset.name, disk.code_fingerprint())


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, bundle.BundleWarning)]


@pytest.mark.parametrize("kind", ["no manifest", "other torch", "other opset"])
def test_a_foreign_bundle_is_ignored_with_one_warning(tmp_path, monkeypatch, fresh_warnings, kind):
    root = tmp_path / "b"
    (root / "kernels" / disk.folder_name(OpSet.preset("core_aten"))).mkdir(parents=True)
    if kind == "other torch":
        bundle.write_manifest(root, "0" * 64, opsets={})
        (root / bundle.MANIFEST).write_text((root / bundle.MANIFEST).read_text().replace('"torch": "', '"torch": "1.'))
    elif kind == "other opset":
        bundle.write_manifest(root, disk.code_fingerprint(), opsets={"x": "core_aten"})
    monkeypatch.setenv("EAGERDECOMP_BUNDLE", str(root))
    opset = "prims" if kind == "other opset" else "core_aten"
    (first, texts1), (second, texts2) = _caught(lambda: _folders(opset)), _caught(lambda: _folders(opset))
    assert first == second == ()
    assert len(texts1) == 1 and not texts2, (texts1, texts2)
    assert {"no manifest": "no readable manifest", "other torch": "torch 1.", "other opset": "opset prims"}[kind] in (
        texts1[0]
    )


def test_a_usable_bundle_is_searched_after_the_own_folder(tmp_path, monkeypatch, fresh_warnings):
    root = tmp_path / "b"
    folder = root / "kernels" / disk.folder_name(OpSet.preset("core_aten"))
    folder.mkdir(parents=True)
    bundle.write_manifest(root, disk.code_fingerprint(), opsets={folder.name: "core_aten"})
    monkeypatch.setenv("EAGERDECOMP_BUNDLE", os.pathsep.join([str(root), str(tmp_path / "missing")]))
    found, texts = _caught(_folders)
    assert found == (folder,) and len(texts) == 1 and "missing" in texts[0]


def test_an_unreadable_bundle_entry_is_a_miss_and_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "_warned", type(disk._warned)())
    own, shipped = tmp_path / "own", tmp_path / "shipped"
    shipped.mkdir()
    store = disk.Store(own, (shipped,))
    bad = store._path("some key", shipped)
    bad.write_bytes(b"not a pickle")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert store._read("some key", "key") is None
    assert bad.exists()  # a bundle's files are never removed
    store._write("some key", "key", lambda: "kernel id")
    assert store._read("some key", "key") == "kernel id"  # written to, and read from, our own folder
    assert bad.read_bytes() == b"not a pickle"


def test_the_command_line_builds_and_describes_a_bundle(tmp_path, capsys):
    from eagerdecomp.__main__ import main

    out = tmp_path / "b"
    env = os.environ | {"EAGERDECOMP_CACHE_DIR": str(tmp_path / "c")}
    build = subprocess.run(  # (a process of its own: building points its disk cache at the bundle)
        [sys.executable, "-m", "eagerdecomp", "cache", "build", "--workloads", "", "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert main(["cache", "info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["usable here"] is True
    with pytest.raises(SystemExit) as e:
        main(["cache", "build", "--dtypes", "int8", "-o", str(out)])
    assert e.value.code == 2 and "not a floating torch dtype" in capsys.readouterr().err


# the shipped workloads' models at other lengths and prompts than the bundle's (bench/shapes.py's)
MODELS = textwrap.dedent(
    """
    import sys, warnings, torch
    warnings.simplefilter("ignore")
    import eagerdecomp as ed
    from eagerdecomp import workloads as W
    from eagerdecomp.demo import TransformerBlock, train_step
    out = []
    torch.manual_seed(0)
    block = TransformerBlock(dropout=0.0)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    x, y = TransformerBlock.batch()
    bert = W.bert()
    bopt = torch.optim.AdamW(bert.parameters(), lr=1e-3)
    batches = W.bert_batches([13, 27])
    llama = W.llama()
    ids = torch.randint(0, W.VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    with ed.EagerDecompMode("core_aten"):
        out.append(float(train_step(block, opt, x, y)[1]))
        out += [float(W.bert_step(bert, bopt, b)) for b in batches]
        out.append(W.generate(llama, ids, 16).tolist())
    print(ed.cache_info().traced)
    print(repr(out))
    """
)


@pytest.mark.heavy
def test_the_default_bundle_leaves_nothing_to_trace_for_the_demo_bert_and_llama(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "b"
    build = subprocess.run(
        [sys.executable, "-m", "eagerdecomp", "cache", "build", "-o", str(out)],
        env=os.environ | {"EAGERDECOMP_CACHE_DIR": str(tmp_path / "c")},
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    runs = {}
    for name, env in (("cold", {}), ("bundle", {"EAGERDECOMP_BUNDLE": str(out)})):
        env |= {"EAGERDECOMP_CACHE_DIR": str(tmp_path / name), "EAGERDECOMP_DISK_CACHE": "1"}
        traced, results = _python(MODELS, [], env).stdout.strip().splitlines()[-2:]
        runs[name] = int(traced), results
    assert runs["cold"][0] > 0 and runs["bundle"][0] == 0, runs
    assert runs["bundle"][1] == runs["cold"][1]
