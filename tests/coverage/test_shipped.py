"""The graph the package ships: used at once when it was built for this torch and these
sources, never when its fingerprint differs, rebuilt with progress then.

The shipped file itself is checked against the sources here: after an edit to a decomposition
or to the code that builds the graph, ``make coverage-graph`` writes it again.
"""

import gzip
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import eagerdecomp.coverage.graph as graph_mod
from eagerdecomp.coverage.workers import ProgressBar, guarded_map

NODE = {"kind": "decomposes", "children": ["aten.mul.Tensor"], "via": "x", "reason": "", "samples": 1, "notes": []}
TOY = {"aten": {"aten.silu.default": NODE}, "prims": {"aten.silu.default": NODE}}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_build(monkeypatch):
    """build_graph replaced: a test that reaches it fails, or counts it where it must build."""
    calls = []

    def build(**kw):
        calls.append(kw)
        return graph_mod.Graph({"aten": {}, "prims": {}}, build_seconds=0.0)

    monkeypatch.setattr(graph_mod, "build_graph", build)
    return calls


def _stamp(path, **changes):
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    data.update(changes)
    with gzip.open(path, "wt") as f:
        json.dump(data, f)


def test_the_shipped_graph_is_current():
    graph, why = graph_mod.read_shipped()
    assert graph is not None, f"{why}: run `make coverage-graph` and commit {graph_mod.SHIPPED}"
    assert graph.aten_ops() and set(graph.flavours) == {"aten", "prims"}


def test_a_matching_shipped_graph_answers_without_building(tmp_path, empty_cache, no_build, monkeypatch):
    shipped = graph_mod.write_shipped(graph_mod.Graph(TOY), tmp_path / "graph.json.gz")
    monkeypatch.setattr(graph_mod, "SHIPPED", shipped)
    graph = graph_mod.load_graph(quiet=True)
    assert (graph.source, graph.flavours, no_build) == ("shipped", TOY, [])


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"fingerprint": "0" * 16}, "other sources"),
        ({"fingerprint": "0" * 16, "torch": "2.0.0"}, "for torch 2.0.0"),
        ({"fingerprint": None}, "other sources"),
    ],
)
def test_a_stale_shipped_graph_is_never_used(changes, why, tmp_path, empty_cache, no_build, monkeypatch, capsys):
    shipped = graph_mod.write_shipped(graph_mod.Graph(TOY), tmp_path / "graph.json.gz")
    _stamp(shipped, **changes)
    monkeypatch.setattr(graph_mod, "SHIPPED", shipped)
    graph, reason = graph_mod.read_shipped()
    assert graph is None and why in reason
    built = graph_mod.load_graph()
    assert built.source == "built" and built.flavours != TOY and len(no_build) == 1
    assert why in capsys.readouterr().err  # the user is told why it builds
    # and the graph it built is what the next process finds in the cache
    again = graph_mod.load_graph()
    assert again.source == "cache" and len(no_build) == 1


def test_the_fingerprint_names_the_torch_build(monkeypatch):
    before = graph_mod.fingerprint()
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert graph_mod.fingerprint() != before


def test_writing_the_same_graph_gives_the_same_bytes(tmp_path):
    a = graph_mod.write_shipped(graph_mod.Graph(TOY), tmp_path / "a.json.gz").read_bytes()
    b = graph_mod.write_shipped(graph_mod.Graph(json.loads(json.dumps(TOY))), tmp_path / "b.json.gz").read_bytes()
    assert a == b


def test_the_progress_bar_on_a_log_writes_a_line_per_tenth():
    out = io.StringIO()
    bar = ProgressBar(out, "analysing ops")
    bar.start(200)
    for done in range(201):
        bar.update(done)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in out.getvalue()
    assert lines[0].startswith("analysing ops [") and "0/200 (0%)" in lines[0]
    assert "100/200 (50%)" in lines[5] and "left" in lines[5] and lines[-1].split("] ")[1].startswith("200/200 (100%)")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_on_a_terminal_redraws_one_line_and_ends_it():
    out = _Terminal()
    bar = ProgressBar(out, "running OpInfo samples", prefix="[x] ")
    bar.start(50)
    for done in range(51):
        bar.update(done)
    text = out.getvalue()
    assert text.startswith("\r[x] running OpInfo samples [") and text.endswith("50/50 (100%), 0 s\n")
    assert text.count("\n") == 1  # one line, redrawn in place, ended once the count is complete
    bar.start(4, "analysing ops")
    bar.update(1)
    bar.interrupt()  # a message is printed next: the half-drawn line is ended first
    assert out.getvalue().endswith("1/4 (25%), 0 s, about 0 s left\n")


class _Recorder(ProgressBar):
    def __init__(self):
        super().__init__(io.StringIO(), "test")
        self.seen = []

    def update(self, done):
        self.seen.append(done)


def _square_or_crash(i):
    if i == 7:
        os._exit(3)  # a kernel taking its worker down
    return i * i


def test_guarded_map_counts_every_item_on_the_bar_crash_included():
    bar = _Recorder()

    def progress(msg):
        raise AssertionError(f"with a bar, no message expected: {msg}")

    progress.bar = bar
    results = guarded_map(_square_or_crash, list(range(20)), 2, progress)
    assert results == {i: (None if i == 7 else i * i) for i in range(20)}
    assert bar.seen == sorted(bar.seen) and bar.seen[-1] == 20


def test_coverage_summary_in_a_fresh_process_reads_the_shipped_graph(tmp_path):
    if graph_mod.read_shipped()[0] is None:
        pytest.skip("the shipped graph is stale: test_the_shipped_graph_is_current says so")
    env = dict(os.environ, EAGERDECOMP_CACHE_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "eagerdecomp", "coverage", "--summary", "--top", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("core_aten (") and "Implement next" in proc.stdout
    assert "building the coverage graph" not in proc.stderr
    assert not list(tmp_path.rglob("coverage-*.json"))  # nothing built, nothing cached
