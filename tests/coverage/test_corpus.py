"""Coverage by models: per-model verdicts and blockers, the greedy target sets, the shipped
corpus, PyTorch's benchmark corpus read where it lies, the CLI, and the check against reality:
a model the analysis says runs does run under the mode, a blocked one stops on a blocker it named.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import eagerdecomp as ed
import eagerdecomp.coverage as cov
from eagerdecomp.__main__ import main
from eagerdecomp.coverage.models import LEGACY_NAMES, TARGETS, Corpus, analyse_models, load_corpus
from eagerdecomp.coverage.record import DATA

# PyTorch's data: read in place, never copied into the repository (see ../shared/data/README.md)
PYTORCH_CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "pytorch_model_ops.json"

A, B, C, D, E, F, G, H = (f"aten.{n}.default" for n in ("sin", "cos", "tan", "exp", "log", "log2", "log10", "sqrt"))
UNKNOWN = "aten.made_up_op.default"  # a name no graph holds: "not analysed"


@pytest.fixture(scope="module")
def toy():
    # as test_coverage's toy: real op names, made-up edges
    nodes = {
        A: ("decomposes", [B, C]),
        B: ("no decomposition", []),
        C: ("decomposes", [D]),
        D: ("no decomposition", []),
        E: ("decomposes", [F]),
        F: ("decomposes", [E]),  # a cycle
        G: ("undetermined", []),
        H: ("decomposes", [G, B]),
    }
    full = {
        k: {"kind": kind, "children": kids, "reason": kind, "via": "", "samples": 1, "notes": []}
        for k, (kind, kids) in nodes.items()
    }
    return cov.Graph({"aten": full, "prims": full})


def corpus_of(models: dict) -> Corpus:
    return Corpus("toy", {m: {"family": fam, "ops": {op: 1 for op in ops}} for m, (fam, ops) in models.items()}, {})


TOY_MODELS = {
    "runs": ("x", [B]),
    "needs-d": ("x", [A]),
    "needs-g": ("y", [H]),
    "cycle": ("y", [E]),
    "needs-d-and-unknown": ("y", [A, UNKNOWN]),
    "needs-d-and-g": ("y", [A, H]),
}


def test_model_verdicts_and_blockers_on_a_toy_graph(toy):
    m = analyse_models(cov.analyse(toy, [B]), corpus_of(TOY_MODELS))
    assert m.status == {
        "runs": "runs",
        "needs-d": "blocked",
        "needs-g": "undetermined",
        "cycle": "blocked",
        "needs-d-and-unknown": "blocked",
        "needs-d-and-g": "blocked",
    }
    assert {k: sorted(v) for k, v in m.blockers.items()} == {
        "runs": [],
        "needs-d": [D],
        "needs-g": [G],
        "cycle": [E],
        "needs-d-and-unknown": [D, UNKNOWN],
        "needs-d-and-g": [D, G],
    }
    assert (m.kind(D), m.kind(G), m.kind(E), m.kind(UNKNOWN)) == (
        "no decomposition",
        "undetermined",
        "cycle",
        "not analysed",
    )
    assert m.families() == {"x": (1, 2), "y": (0, 4)} and m.counts() == {"runs": 1, "blocked": 4, "undetermined": 1}
    # ranked by models the op alone unlocks, then by blocked models that need it
    assert m.implement_next(10) == [(D, 1, 3), (G, 1, 2), (E, 1, 1), (UNKNOWN, 0, 1)]
    # greedy: {D, G} completes three models for two ops, the best rate; 4 of 6 run, past 50%
    assert m.ops_for(50) == [D, G]
    assert m.ops_for(0) == []


def test_adding_a_models_blockers_makes_it_run(toy):
    """The blockers are sufficient: add them to the opset, analyse again, the model runs; and
    the greedy set for each target reaches it."""
    corpus = corpus_of({k: v for k, v in TOY_MODELS.items() if UNKNOWN not in v[1]})  # an OpSet cannot hold UNKNOWN
    m = analyse_models(cov.analyse(toy, [B]), corpus)
    for model, blockers in m.blockers.items():
        assert analyse_models(cov.analyse(toy, [B, *blockers]), corpus).status[model] == "runs", model
    for percent in TARGETS:
        assert analyse_models(cov.analyse(toy, [B, *m.ops_for(percent)]), corpus).share() >= percent, percent
    assert len(m.ops_for(100)) == 3  # D, G and E: every blocker once


@pytest.mark.skipif(not DATA.exists(), reason="no recorded corpus")
def test_shipped_corpus_says_where_it_came_from():
    data = json.loads(DATA.read_text())
    assert data["versions"]["transformers"] and data["versions"]["torch"] and data["recorded"]
    corpus = load_corpus()
    assert len(corpus.models) >= 200
    families = {m["family"] for m in corpus.models.values()}
    assert {"decoder LM", "encoder LM", "vision", "classic CNN"} <= families
    assert any("MoE" in f for f in families) and any("state-space" in f for f in families)
    for name, m in data["models"].items():
        assert "train" in m["phases"] and m["phases"]["train"], name
    for op in data["ops"]:  # every recorded name is an overload of today's torch
        ns, packet, overload = op.split(".")
        assert getattr(getattr(getattr(torch.ops, ns), packet), overload) is not None, op


@pytest.mark.skipif(not PYTORCH_CORPUS.exists(), reason="../shared/data/pytorch_model_ops.json is not there")
def test_pytorch_corpus_reads_in_place_with_todays_names():
    corpus = load_corpus(PYTORCH_CORPUS)
    assert len(corpus.models) == 145 and set(corpus.families()) == {"hf_train", "timm_train", "torchbench_train"}
    ops = {op for m in corpus.models.values() for op in m["ops"]}
    assert not ops & set(LEGACY_NAMES)
    for op in ops:
        ns, packet, overload = op.split(".")
        assert getattr(getattr(getattr(torch.ops, ns), packet), overload) is not None, op


def test_cli_models_table_and_json(toy, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path))
    cov.save_graph(toy)
    path = tmp_path / "toy.json"
    data = {
        "format": "eagerdecomp model corpus 1",
        "recorded": "2026-11-23",
        "versions": {"torch": "x"},
        "ops": sorted({o for _, ops in TOY_MODELS.values() for o in ops}),
    }
    index = {op: i for i, op in enumerate(data["ops"])}
    data["models"] = {
        m: {"family": fam, "phases": {"train": [[index[o], 2] for o in ops]}} for m, (fam, ops) in TOY_MODELS.items()
    }
    path.write_text(json.dumps(data))
    ops_file = tmp_path / "ops.txt"
    ops_file.write_text(B + "\n")
    out = tmp_path / "m.json"
    assert (
        main(
            [
                "coverage",
                "--opset-file",
                str(ops_file),
                "--models",
                "--corpus",
                str(path),
                "--format",
                "json",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    got = json.loads(out.read_text())["corpora"][0]
    expected = analyse_models(cov.analyse(toy, [B]), load_corpus(path))
    assert got["counts"] == expected.counts() and got["targets"]["50"] == expected.ops_for(50) == [D, G]
    model = got["models"]["needs-d-and-unknown"]
    assert {k: model[k] for k in ("family", "status", "blockers")} == {
        "family": "y",
        "status": "blocked",
        "blockers": [D, UNKNOWN],
    }
    # (the toy's ops are not torch's: the CPU tier could not run them either)
    assert model["cpu_tier"]["runs"] is False and model["cpu_tier"]["refused"][1] == "not an op of this torch"
    assert main(["coverage", "--opset-file", str(ops_file), "--models", "--corpus", str(path), "--target", "50"]) == 0
    text = capsys.readouterr().out
    tier = f"with the CPU tier {expected.with_cpu_tier()} run"
    assert f"6 models: 1 run (16.7%), 4 blocked, 1 undetermined; {tier}" in text and f"50%: 2 ops: {D}, {G}" in text


# -- against reality -------------------------------------------------------------------------------

# a sample of the corpus with a narrow graph: their ops, and the OpInfos that give those ops samples
SAMPLE = ["cnn/LeNet5", "cnn/ResNet", "cnn/GoogLeNet"]
SAMPLE_OPINFOS = {
    "nn.functional.conv2d",
    "nn.functional.avg_pool2d",
    "nn.functional.max_pool2d",
    "nn.functional.batch_norm",
    "nn.functional.cross_entropy",
    "nn.functional.linear",
    "tanh",
    "nn.functional.relu",
    "mean",
    "sum",
    "nn.functional.adaptive_avg_pool2d",
    "cat",
    "mul",
    "add",
    "addcmul",
    "addcdiv",
    "lerp",
    "sqrt",
    "div",
}


@pytest.fixture(scope="module")
def sample_graph():
    if not DATA.exists():
        pytest.skip("no recorded corpus")
    corpus = load_corpus()
    ops = sorted({op for m in SAMPLE for op in corpus.models[m]["ops"]})
    return cov.build_graph(ops, SAMPLE_OPINFOS, quiet=True), Corpus("sample", {m: corpus.models[m] for m in SAMPLE}, {})


def _run(model_name, opset):
    from eagerdecomp.coverage.record import build, specs, train_step

    spec = next(s for s in specs(only=[model_name]) if s["name"] == model_name)
    model, x, labels, _, _ = build(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ed.EagerDecompMode(opset):
        train_step(model, x, labels, opt)


def test_verdicts_hold_when_the_models_run(sample_graph):
    """Under core_aten, and under core_aten without tanh (which has no decomposition): each
    model said to run trains under the mode; each blocked one stops on one of its blockers."""
    graph, corpus = sample_graph
    core = ed.OpSet.preset("core_aten")
    seen = set()
    for opset in (core, core - ed.OpSet(["aten.tanh.default"])):
        m = analyse_models(cov.analyse(graph, opset), corpus)
        for model, status in m.status.items():
            seen.add(status)
            if status == "runs":
                _run(model, opset)
            elif status == "blocked":
                with pytest.raises(ed.UnsupportedOpError) as err:
                    _run(model, opset)
                assert any(b in str(err.value) for b in m.blockers[model]), (model, m.blockers[model], str(err.value))
    assert {"runs", "blocked"} <= seen


def test_record_writes_a_corpus_the_analysis_reads(tmp_path, monkeypatch):
    """`coverage record` end to end on two of the hand-written CNNs (no transformers needed)."""
    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "models.json"
    # NOTE: in a fresh process, as users run it: recording forks a child per model, and a fork
    # taken after this process ran autograd (earlier tests did) cannot use autograd in the child
    cmd = [
        sys.executable,
        "-m",
        "eagerdecomp",
        "coverage",
        "record",
        "--only",
        "cnn/LeNet5",
        "cnn/ResNet",
        "-o",
        str(out),
    ]
    assert subprocess.run(cmd, env=dict(os.environ), timeout=600).returncode == 0
    data = json.loads(out.read_text())
    assert data["versions"]["torch"] == torch.__version__ and data["recorded"] and data["skipped"] == {}
    corpus = load_corpus(out)
    assert set(corpus.models) == {"cnn/LeNet5", "cnn/ResNet"}
    lenet = corpus.models["cnn/LeNet5"]["ops"]
    # two Tanh layers, forward only; backward and AdamW ops are there too
    assert lenet["aten.tanh.default"] == 2 and lenet["aten.tanh_backward.default"] == 2
    assert "aten.convolution_backward.default" in lenet and "aten.addcdiv_.default" in lenet
    assert not list((tmp_path / "cache" / "coverage").glob("record-*.jsonl"))  # the checkpoint is gone once written


def test_cpu_tier_column_by_the_tiers_rules():
    from eagerdecomp.coverage.models import _tier_refusal

    assert _tier_refusal("aten.linalg_eigh.default") is None
    assert "alias an input" in _tier_refusal("aten.t.default")
    assert "random" in _tier_refusal("aten.bernoulli.p")
    assert "in-place view" in _tier_refusal("aten.as_strided_.default")
