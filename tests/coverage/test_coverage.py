"""Coverage analysis: the graph-derived answer against real lowering, the fixpoint, the greedy
ranking, the CLI and the profiler.

The graph is built for a handful of ops (and every op their decompositions call, which the
build follows), not all 3000: the full build takes minutes and is exercised by the CLI.
"""

import json
import textwrap

import pytest
import torch

import eagerdecomp as ed
import eagerdecomp.coverage as cov
from eagerdecomp.__main__ import main
from eagerdecomp.profile import profile
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten

# non-core ops with decompositions of several shapes: pointwise, loss, in-place view,
# backward, in-place and out= variants (all overloads of each packet)
PACKETS = [
    "aten::silu",
    "aten::hardswish",
    "aten::addcmul",
    "aten::softplus",
    "aten::t_",
    "aten::mse_loss",
    "aten::elu_backward",
    "aten::logaddexp",
    "aten::glu",
]
OPINFOS = {
    "nn.functional.silu",
    "nn.functional.hardswish",
    "addcmul",
    "nn.functional.softplus",
    "nn.functional.mse_loss",
    "nn.functional.elu",
    "logaddexp",
    "nn.functional.glu",
}
SMALL = [
    "aten::mul.Tensor",
    "aten::add.Tensor",
    "aten::sub.Tensor",
    "aten::div.Tensor",
    "aten::exp",
    "aten::copy_",
    "aten::as_strided_",
]  # a made-up backend: no sigmoid, no neg


@pytest.fixture(scope="module")
def graph():
    return cov.build_graph(PACKETS, OPINFOS, quiet=True)


@pytest.fixture(scope="module")
def subset(graph):
    return sorted(str(op) for p in PACKETS for op in ed.OpSet([p]).ops)


def test_graph_answer_agrees_with_real_lowering(graph, subset):
    """For each op of the subset: the graph's verdict under an opset, against lowering it
    for real on its samples with that opset's table (eagerdecomp.lower.Lowerer)."""
    small = ed.OpSet(SMALL, name="small")
    opsets = {"core_aten": "core_aten", "prims": "prims", "small": small}
    real = dict(zip(opsets, cov.verify(list(opsets.values()), subset, OPINFOS)))
    for label, target in opsets.items():
        report = cov.analyse(graph, target)
        checked = 0
        for op in subset:
            row, got = report.row(op), real[label][op]
            assert got is not None, f"{label}: {op}: lowering it crashed the worker"
            if row.status == "undetermined" or not got["samples"]:
                continue
            checked += 1
            if row.status in ("reaches", "in opset"):
                assert got["ok"] == got["samples"], f"{label}: {op}: graph says {row.status}, lowering said {got}"
                assert set(got["leaves"]) <= set(row.leaves), (
                    f"{label}: {op}: lowering ran {got['leaves']}, graph says {row.leaves}"
                )
            else:
                assert row.status == "no path"
                assert got["ok"] < got["samples"] and got["stuck"], (
                    f"{label}: {op}: graph says no path, lowering said {got}"
                )
                # lowering stops at the first blocker it meets; the graph names one of them:
                # both must be ops the graph knows cannot be lowered into this opset, because
                # they have no decomposition or go round a cycle
                real_ends = [(s.split(": ")[0].split(" -> ")[-1], s.split(": ")[-1]) for s in got["stuck"]]
                for blocker, reason in [(row.blocker, row.reason)] + real_ends:
                    assert blocker not in report.depth, (label, op, blocker)
                    kind = report.nodes[blocker]["kind"]
                    assert kind in ("no decomposition", "declined") or reason == "decomposition cycle", (
                        label,
                        op,
                        blocker,
                        kind,
                    )
        assert checked >= len(subset) // 2, (label, checked)
        # coverage.check (behind `report --verify`) reads the same comparison the same way
        counts, mismatches = cov.check(report, real[label])
        assert sum(counts.values()) == len(subset) and mismatches == [], (label, counts, mismatches)


def test_reaches_names_depth_and_leaves(graph):
    report = cov.analyse(graph, "core_aten")
    core = {str(o) for o in ed.OpSet.preset("core_aten").ops}
    row = report.row(aten.silu.default)
    node = graph.nodes("aten")["aten.silu.default"]
    # silu's decomposition calls core ops only (sigmoid, mul): one level down, landing on them
    assert row.status == "reaches" and node["children"] and set(node["children"]) <= core
    assert row.depth == 1 and row.leaves == node["children"]
    inplace_view = report.row(aten.t_.default)
    assert inplace_view.status == "reaches" and "aten.as_strided_.default" in inplace_view.leaves
    assert inplace_view.depth >= 2  # t_ -> t -> (transpose ->) permute


def test_no_path_names_the_blocking_op(graph):
    small = ed.OpSet(SMALL, name="small")
    report = cov.analyse(graph, small)
    row = report.row(aten.silu.default)
    assert row.status == "no path"
    # the chain goes down through ops outside the opset to one with no decomposition
    assert row.chain[0] == "aten.silu.default" and len(row.chain) >= 2
    assert all(op not in {str(o) for o in small.ops} for op in row.chain)
    # it ends at an op with no decomposition, or where the chain goes round a cycle
    # (aten.neg -> prims.neg -> aten.neg: prims decompose back into aten for aten opsets)
    if row.reason == "decomposition cycle":
        assert row.blocker in row.chain[:-1]
    else:
        assert graph.nodes("aten")[row.blocker]["kind"] in ("no decomposition", "declined")
    # give the backend the blocker: silu's verdict must move past it
    again = cov.analyse(graph, small | ed.OpSet([row.blocker]))
    assert again.row(aten.silu.default).blocker != row.blocker


def test_implement_next_is_greedy_and_counts_are_real(graph):
    small = ed.OpSet(SMALL, name="small")
    report = cov.analyse(graph, small)
    base = report.counts()
    reached = base["in opset"] + base["reaches"]
    picks = report.implement_next(3)
    assert picks
    gains = {}
    for cand in sorted(set(graph.nodes("aten")) - set(report.depth)):
        c = cov.analyse(graph, small | ed.OpSet([cand])).counts()
        gains[cand] = c["in opset"] + c["reaches"] - reached
    top, n = picks[0]
    assert n == gains[top] == max(gains.values())
    # the second pick is counted with the first one done
    both = cov.analyse(graph, small | ed.OpSet([top, picks[1][0]])).counts() if len(picks) > 1 else None
    if both:
        assert both["in opset"] + both["reaches"] - reached == n + picks[1][1]


def test_fixpoint_on_a_toy_graph():
    # real op names (so an OpSet can hold them), made-up edges
    a, b, c, d, e, f, g, h = (f"aten.{n}.default" for n in ("sin", "cos", "tan", "exp", "log", "log2", "log10", "sqrt"))
    nodes = {
        a: ("decomposes", [b, c]),
        b: ("no decomposition", []),
        c: ("decomposes", [d]),
        d: ("no decomposition", []),
        e: ("decomposes", [f]),  # e and f only decompose into each other
        f: ("decomposes", [e]),
        g: ("undetermined", []),
        h: ("decomposes", [g, b]),
    }
    full = {
        k: {"kind": kind, "children": kids, "reason": kind, "via": "", "samples": 1, "notes": []}
        for k, (kind, kids) in nodes.items()
    }
    toy = cov.Graph({"aten": full, "prims": full})

    only_b = cov.analyse(toy, [b])
    assert (only_b.row(a).status, only_b.row(a).chain) == ("no path", [a, c, d])
    assert (only_b.row(h).status, only_b.row(h).blocker) == ("undetermined", g)
    assert (only_b.row(e).status, only_b.row(e).reason) == ("no path", "decomposition cycle")
    assert only_b.implement_next(1) == [(d, 3)]  # d unlocks d, c and a
    assert only_b.unlocked_by(g) == {g, h}

    with_d = cov.analyse(toy, [b, d])
    assert (with_d.row(a).status, with_d.row(a).depth, with_d.row(a).leaves) == ("reaches", 2, [b, d])
    assert with_d.counts() == {"in opset": 2, "reaches": 2, "no path": 2, "undetermined": 2}


@pytest.fixture
def cached(graph, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path))
    cov.save_graph(graph)
    return graph


def test_cli_report_formats(cached, tmp_path, capsys):
    assert main(["coverage", "--opset", "core_aten", "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    expected = cov.analyse(cached, "core_aten")
    assert data["counts"] == expected.counts()
    assert [(p["op"], p["unlocks"]) for p in data["implement_next"]] == expected.implement_next(10)
    assert main(["report", "--opset", "prims", "--summary"]) == 0  # the verb's old name, an alias
    out = capsys.readouterr().out
    assert out.startswith("prims (") and "Implement next" in out
    assert main(["coverage", "--op", "silu.default"]) == 0
    assert "aten.silu.default: reaches" in capsys.readouterr().out
    ops = tmp_path / "ops.txt"
    ops.write_text("# my backend\n" + "\n".join(SMALL) + "\n")
    assert main(["coverage", "--opset-file", str(ops), "--format", "json", "-o", str(tmp_path / "s.json")]) == 0
    small = json.loads((tmp_path / "s.json").read_text())
    assert small["counts"] == cov.analyse(cached, ed.OpSet(SMALL)).counts()
    (tmp_path / "bad.txt").write_text("aten::mull.Tensor\n")
    assert main(["report", "--opset-file", str(tmp_path / "bad.txt")]) == 2
    assert "did you mean aten::mul.Tensor" in capsys.readouterr().err
    assert main(["coverage", "--format", "html", "-o", str(tmp_path / "c.html")]) == 0
    html = (tmp_path / "c.html").read_text()
    assert "<script" in html and "http://" not in html.split('<script id="data"')[0] and "aten.silu.default" in html


def test_profile_routes_and_results():
    ed.cache_clear()  # silu must trace here, whatever earlier tests left in the process-wide cache
    x = torch.randn(16, 8)
    w = torch.randn(8, 4)

    def fn(x, w):
        return torch.nn.functional.silu(x @ w), torch.nn.functional.silu(x @ w + 1)

    with RecordingMode() as rec:
        p = profile(fn, x, w, opset="core_aten")
    rec.assert_only("core_aten")
    for got, want in zip(p.result, fn(x, w)):
        torch.testing.assert_close(got, want)  # silu = x * sigmoid(x): equal to within rounding
    silu = p.by_op["aten.silu.default"]
    # same key twice: both calls run direct (a key is traced on its third call: runtime/tiers.py)
    assert silu["direct"][0] == 2 and "tracing" not in silu
    assert p.calls["passthrough"] >= 2  # mm (x@w) twice
    row = p.report.row(aten.silu.default)
    assert row.route == "decomposed" and "aten.sigmoid.default" in row.into
    assert sum(p.seconds.values()) <= p.wall
    text = str(p)
    assert "direct" in text and "aten.silu.default" in text


def test_profile_lists_ops_without_a_path():
    p = profile(lambda x: torch.sigmoid(x) * 2, torch.randn(4), opset=ed.OpSet(SMALL))
    assert p.calls["fallthrough"] >= 1
    assert [r.op for r in p.report.by_route("unsupported")] == ["aten.sigmoid.default"]
    assert "no path to the opset" in str(p)


def test_cli_profile_runs_a_script(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(
        textwrap.dedent("""
        import sys, torch
        x = torch.randn(8)
        y = torch.nn.functional.hardswish(x)
        print("argv", sys.argv[1:])
    """)
    )
    assert main(["profile", "--format", "json", str(script), "--flag"]) == 0
    out = capsys.readouterr().out
    assert "argv ['--flag']" in out
    data = json.loads(out[out.index("{") :])
    ops = {r["op"]: r for r in data["ops"]}
    assert ops["aten.hardswish.default"]["route"] == "decomposed"
    assert data["routes"]["direct"]["calls"] == 1  # (a key runs direct until it proves hot)


@pytest.mark.parametrize("name", ["_scaled_dot_product_flash_attention_for_cpu_backward", "_grouped_mm"])
def test_ops_no_opinfo_reaches_get_samples_and_a_verdict(name):
    """SDPA's OpInfo samples are 3-d (the math path) and no OpInfo calls _grouped_mm: the
    graph captures small programs for them instead of calling them undetermined."""
    from eagerdecomp.coverage.graph import _tables, one_level
    from eagerdecomp.coverage.inputs import Pool, _from_programs

    op = getattr(torch.ops.aten, name).default
    pool = Pool()
    _from_programs(pool)
    samples = pool.by_op[op]
    assert samples and {s.source for s in samples} == {"program"}
    node, _ = one_level(op, samples, _tables()["aten"])
    assert node.kind == "decomposes", node
