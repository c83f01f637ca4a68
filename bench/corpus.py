"""Coverage by models: our corpus against PyTorch's, and the time of the 90% question.

Both corpora are answered by the same path analysis on each preset (``core_aten``, ``prims``, ``prims_fusion``): models
that run, per family, and the greedy op set to add for 90% of the models. PyTorch's corpus
(``pytorch_model_ops.json``: its benchmark suites' training steps, 2022) is read where it
lies, never copied. Then, with the path graph cached, the time of ``coverage --opset
core_aten --models`` answering the 90% question: in-process (load the cached graph,
analyse, per-model verdicts, the greedy set), and the whole command line (interpreter and
``import torch`` included), medians over ``--rounds``.

    python bench/corpus.py [--pytorch ../shared/data/pytorch_model_ops.json] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import Table, add_json_flag, save

import eagerdecomp.coverage as cov
from eagerdecomp.coverage.models import analyse_models, load_corpus
from eagerdecomp.ops.opset import PRESETS

HERE = Path(__file__).resolve().parent
PYTORCH = HERE.parent.parent / "shared" / "data" / "pytorch_model_ops.json"


def cross_check(graph, corpora) -> Table:
    table = Table(
        "Models whose every op has a path to the opset",
        ["corpus", "opset", "models", "run", "share", "per family (run / models)", "ops to add for 90% (greedy)"],
        formats={"share": "{:.1f}%"},
    )
    for opset in PRESETS:
        c = cov.analyse(graph, opset)
        for corpus in corpora:
            m = analyse_models(c, corpus)
            ops = m.ops_for(90)
            families = ", ".join(f"{family} {runs}/{n}" for family, (runs, n) in m.families().items())
            added = f"{len(ops)}: " + ", ".join(f"`{o.removeprefix('aten.')}`" for o in ops) if ops else "none"
            table.add(corpus.name, opset, len(m.status), m.counts()["runs"], m.share(), families, added)
            print(" | ".join(map(str, table.rows[-1])))
    return table


def timing(rounds: int) -> Table:
    inproc, cli = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        m = analyse_models(cov.analyse(cov.load_graph(), "core_aten"), load_corpus())
        m.ops_for(90)
        inproc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "eagerdecomp",
                "coverage",
                "--opset",
                "core_aten",
                "--models",
                "--summary",
                "--target",
                "90",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        cli.append(time.perf_counter() - t0)
    print(
        f"90% question, graph cached: in-process {statistics.median(inproc):.2f} s, "
        f"command line {statistics.median(cli):.2f} s (medians of {rounds})"
    )
    table = Table(
        f"The 90% question with the path graph cached, seconds (medians of {rounds})",
        ["in-process (load graph, analyse, per-model verdicts, greedy set)", "whole command line"],
        formats={
            "in-process (load graph, analyse, per-model verdicts, greedy set)": "{:.2f}",
            "whole command line": "{:.2f}",
        },
    )
    table.add(statistics.median(inproc), statistics.median(cli))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pytorch", type=Path, default=PYTORCH)
    parser.add_argument("--rounds", type=int, default=5)
    add_json_flag(parser)
    args = parser.parse_args()
    graph = cov.load_graph()  # builds and caches it the first time (minutes)
    corpora = [load_corpus()] + ([load_corpus(args.pytorch)] if args.pytorch.exists() else [])
    save(args.json, "corpus", [cross_check(graph, corpora), timing(args.rounds)])


if __name__ == "__main__":
    main()
