"""Write the conformance summary: counts per class and a per-op table (Markdown and JSON)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from collections import Counter, defaultdict

import torch

from . import harness
from .harness import CLASSES

__all__ = ["write_summary", "write_shard", "merge_shards", "checkout_commit"]


def _collect(results):
    per_op: dict = defaultdict(
        lambda: {
            "counts": Counter(),
            "blockers": Counter(),
            "dtypes": set(),
            "failures": [],
            "stream_differs": False,
            "expected": set(),
        }
    )
    totals = Counter()
    variants = Counter()
    for name, dtype, index, outcome, why in results.rows:
        row = per_op[name]
        row["counts"][outcome.cls] += 1
        row["dtypes"].add(dtype)
        totals[outcome.cls] += 1
        variants[outcome.variant, outcome.cls] += 1
        if outcome.blocker:
            row["blockers"][outcome.blocker] += 1
        if outcome.stream_differs:
            row["stream_differs"] = True
        if why:
            row["expected"].add(why)
        if outcome.cls in ("unsupported", "wrong", "error") and len(row["failures"]) < 5:
            row["failures"].append(f"{dtype} sample {index} [{outcome.variant}] {outcome.cls}: {outcome.detail}")
    return per_op, totals, variants


def write_summary(results, directory: str, full: bool = True, extra: dict | None = None) -> None:
    """Write ``conformance.{md,json}`` (a full run) or ``conformance-fast.{md,json}`` (the fast slice).

    ``extra`` adds to the summary's meta (a merged run's shards, commits and failed tests).
    """
    per_op, totals, variants = _collect(results)
    os.makedirs(directory, exist_ok=True)
    has_path = sum(totals[c] for c in ("pass", "pass-native", "wrong", "error"))
    passed = totals["pass"] + totals["pass-native"]
    meta = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": ("make conformance" if full else "make test (the fast slice)") + _opset_arg(),
        "opset": harness.OPSET,
        "scope": _scope(full),
        "wall_s": round(time.time() - results.started),
        "samples": sum(totals.values()),
        "counts": {c: totals[c] for c in CLASSES},
        "pass_rate_with_path": round(passed / has_path, 5) if has_path else None,
        "by_variant": {f"{v}:{c}": n for (v, c), n in sorted(variants.items())},
        **(extra or {}),
    }
    ops = {
        name: {
            "dtypes": sorted(row["dtypes"]),
            "counts": {c: row["counts"][c] for c in CLASSES if row["counts"][c]},
            "blockers": dict(row["blockers"]),
            "random_stream_differs": row["stream_differs"],
            "expected": sorted(row["expected"]),
            "failures": row["failures"],
        }
        for name, row in sorted(per_op.items())
    }
    stem = "conformance" if full else "conformance-fast"
    with open(os.path.join(directory, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "ops": ops}, f, indent=1, sort_keys=True)
    with open(os.path.join(directory, stem + ".md"), "w") as f:
        f.write(_markdown(meta, ops))


def checkout_commit(directory: str) -> str:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it ("" outside git)."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+dirty" if head and git("status", "--porcelain", "--untracked-files=no") else "")


def write_shard(
    results, directory: str, shard: tuple, failed: list, exitstatus: int, full: bool = True, part: str = "all"
) -> None:
    """Write one shard's rows (``reports/shards/PART/I-of-N.json``; PART names the test files
    that ran, so a split of one file and of the whole suite never mix) for :func:`merge_shards`."""
    import dataclasses

    i, n = shard
    folder = os.path.join(directory, "shards", part)
    os.makedirs(folder, exist_ok=True)
    data = {
        "shard": [i, n],
        "full": full,
        "scope": _scope(full),
        "commit": getattr(results, "commit", None) or checkout_commit(directory),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "wall_s": round(time.time() - results.started),
        "exitstatus": exitstatus,
        "failed": failed,
        "rows": [(n_, d, k, dataclasses.asdict(o), w) for n_, d, k, o, w in results.rows],
    }
    path = os.path.join(folder, f"{i}-of-{n}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def merge_shards(directory: str, part: str | None = None) -> dict:
    """Merge ``reports/shards/PART/*.json`` into the full summary (PART may be left out when
    there is one); refuses a missing or mixed set."""
    from .conftest import Results
    from .harness import Outcome

    root = os.path.join(directory, "shards")
    parts = sorted(p for p in os.listdir(root) if os.path.isdir(os.path.join(root, p)))
    if part is None:
        if len(parts) != 1:
            raise SystemExit(f"name the part to merge: {parts}")
        part = parts[0]
    shards = []
    for name in sorted(os.listdir(os.path.join(root, part))):
        if name.endswith(".json"):
            with open(os.path.join(root, part, name)) as f:
                shards.append(json.load(f))
    counts = {tuple(s["shard"])[1] for s in shards}
    if len(counts) != 1:
        raise SystemExit(f"shards of different splits in {directory}/shards: {sorted(counts)}; remove the stale ones")
    (n,) = counts
    missing = sorted(set(range(1, n + 1)) - {s["shard"][0] for s in shards})
    if missing:
        raise SystemExit(f"shards {missing} of {n} have not run (make conformance SHARD=i/{n})")
    if len({s["scope"] for s in shards}) != 1:
        raise SystemExit("the shards ran with different scopes (EAGERDECOMP_CONFORMANCE_SAMPLES differs)")
    results = Results()
    for s in shards:
        for name, dtype, index, outcome, why in s["rows"]:
            results.add(name, dtype, index, Outcome(**outcome), why)
    extra = {
        "command": f"make conformance{_opset_arg()} SHARD=i/{n} for i in 1..{n} ({part}), then make conformance-merge",
        "wall_s": sum(s["wall_s"] for s in shards),
        "commits": sorted({s["commit"] for s in shards}),
        "failed_tests": sorted(t for s in shards for t in s["failed"]),
        "date": max(s["date"] for s in shards),
        "scope": shards[0]["scope"],  # the shards' own (a merge need not repeat their SAMPLES)
    }
    write_summary(results, directory, full=shards[0]["full"], extra=extra)
    return extra


def _opset_arg() -> str:
    return "" if harness.OPSET == "core_aten" else f" OPSET={harness.OPSET}"


def _scope(full: bool) -> str:
    from .conftest import FAST_SAMPLES, MAX_SAMPLES

    if not full:
        return f"the fast slice: every OpInfo at one or two dtypes, its first {FAST_SAMPLES} samples"
    if MAX_SAMPLES:
        return f"every OpInfo at every supported dtype, its first {MAX_SAMPLES} samples"
    return "every OpInfo at every supported dtype, every sample"


def _commits(meta) -> str:
    if "commits" not in meta:
        return ""
    failed = meta["failed_tests"]
    return (
        f" (summed over shards), at commit{'s' if len(meta['commits']) > 1 else ''} {', '.join(meta['commits'])}; "
        f"failed tests: {', '.join(failed) if failed else 'none'}"
    )


def _markdown(meta, ops) -> str:
    opset = meta.get("opset", "core_aten")
    lines = [
        f'# Conformance: PyTorch\'s OpInfo database under EagerDecompMode("{opset}")',
        "",
        f"Generated by `{meta['command']}` on {meta['date']} with torch {meta['torch']} (Python {meta['python']}), "
        f"in {meta['wall_s']} s{_commits(meta)}. Scope: {meta['scope']} (dtypes among float32, float64, int64, "
        "bool and bfloat16); in-place and out= variants where the OpInfo has them; gradients of "
        "float64 samples of differentiable ops. See `tests/conformance/` for what is compared.",
        "",
        "| class | samples |",
        "| --- | ---: |",
    ]
    lines += [f"| {c} | {n} |" for c, n in meta["counts"].items()]
    lines += [f"| **total** | {meta['samples']} |", ""]
    if meta["pass_rate_with_path"] is not None:
        lines.append(
            f"Samples whose op has a path to {opset} that pass exactly: {meta['pass_rate_with_path'] * 100:.2f}%."
        )
        lines.append("")
    random_ops = sorted(n for n, r in ops.items() if r["random_stream_differs"])
    if random_ops:
        lines += [
            "Random ops whose decomposition draws a different stream from the native kernel (checked for shape, "
            "dtype, strides, fresh numbers per call and reproducibility under `torch.manual_seed` instead of "
            f"values): {', '.join(random_ops)}.",
            "",
        ]
    lines += [
        "## Per op",
        "",
        "| op | dtypes | " + " | ".join(CLASSES) + " | blocked by / reason |",
        "| --- | --- | " + " | ".join("---:" for _ in CLASSES) + " | --- |",
    ]
    for name, row in ops.items():
        counts = " | ".join(str(row["counts"].get(c, "")) for c in CLASSES)
        note = "; ".join(sorted(row["blockers"])) or ""
        if row["expected"]:
            note = (note + ": " if note else "") + " / ".join(row["expected"])
        lines.append(f"| {name} | {', '.join(row['dtypes'])} | {counts} | {note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m tests.conformance.summary [reports [part]]: merge the shards
    import sys

    from .harness import reports_dir

    directory = sys.argv[1] if len(sys.argv) > 1 else reports_dir("reports")
    info = merge_shards(directory, sys.argv[2] if len(sys.argv) > 2 else None)
    print(f"merged: {info['command']}; commits {info['commits']}; failed tests: {len(info['failed_tests'])}")
