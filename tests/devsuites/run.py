"""Run PyTorch's device suites on CPU and on a reference device, compare, and write the summary.

``python -m tests.devsuites [--device edref|edprims] [--files test_view_ops.py ...] [--select IDS] [--jobs N]``

Each device runs in its own pytest process (with pytest-xdist workers, so a crash
loses one test, not the run) over a temporary copy of the files. A test that passes
on CPU must pass on the device (``edref``, core ATen, the default; ``edprims``, the
prims_fusion preset) unless :mod:`tests.devsuites.known` lists it for that device; a
listed test that passes, or any test that changes the dispatch state, fails the run too.
Writes ``reports/devsuites.md`` and ``.json`` (``reports/devsuites-edprims.*`` for
edprims); exits 1 on anything unexpected.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from .known import reason_for, unused

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(os.environ.get("EAGERDECOMP_PYTORCH_TESTS", ROOT.parent / "shared" / "data" / "pytorch-tests"))
FILES = ("test_view_ops.py", "test_torch.py", "test_nn.py")
DEVICES = ("edref", "edprims")  # the reference devices (eagerdecomp.device.refdev.REFERENCE_DEVICES)


def default_out(device: str) -> Path:
    """The summary's path stem: ``reports/devsuites`` for edref, ``reports/devsuites-DEVICE`` otherwise."""
    return ROOT / "reports" / ("devsuites" if device == "edref" else f"devsuites-{device}")


def run_device(device: str, workdir: Path, files, select, jobs: int, timeout: float) -> dict:
    """``{generic id: record}`` for one device's run of ``files``."""
    out = workdir / f"results-{device}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(
        os.environ,
        EAGERDECOMP_DEVSUITE_DEVICE=device,
        EAGERDECOMP_DEVSUITE_OUT=str(out),
        EAGERDECOMP_DEVSUITE_TIMEOUT=str(timeout),
        PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu" if device == "cpu" else "privateuse1",
        PYTORCH_PRINT_REPRO_ON_FAILURE="0",
        EAGERDECOMP_DISK_CACHE="0",  # no test depends on, or fills, the user's kernel cache
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
    )
    if select:
        env["EAGERDECOMP_DEVSUITE_SELECT"] = str(select)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *files,
        "-p",
        "tests.devsuites.plugin",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        str(jobs),
        "--tb=no",
        "-rN",
        "-W",
        "ignore",
    ]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    records = {}
    for path in glob.glob(str(out / "*.jsonl")):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                records[rec["id"]] = rec
    if not records:
        raise SystemExit(f"devsuites: no test ran on {device}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    collected = set()
    for path in glob.glob(str(out / "collected-*.json")):
        with open(path) as f:
            collected.update(json.load(f))
    # NOTE: a test collected with no result line crashed its worker (xdist starts another)
    for tid in collected - records.keys():
        records[tid] = {"outcome": "failed", "error": "Crash", "message": "no result: its worker crashed"}
    return records


def cause(rec: dict) -> str:
    """A failure's cause, for the summary."""
    if rec.get("state"):
        return "dispatch state changed"
    error, message = rec.get("error", ""), rec.get("message", "")
    if error in ("Crash", "Timeout"):
        return error.lower()
    if error == "UnsupportedOpError":
        return "no path"
    if error == "NotImplementedError" and "backend" in message:
        return "device gap"
    if error == "AssertionError":
        if "not raised" in message:
            return "missing error"
        if "does not match" in message or "Regex" in message:
            return "different error"
        return "wrong result"
    return f"error: {error or 'unknown'}"


def compare(cpu: dict, dev: dict, device: str = "edref") -> dict:
    """Every test id's verdict: ok, expected (known), unexpected failure or unexpected pass."""
    verdicts = {}
    for tid, c in cpu.items():
        if c["outcome"] != "passed":
            continue
        d = dev.get(tid)
        if d is None:  # not instantiated for the device (dtypesIfCPU, onlyCPU...)
            continue
        known = reason_for(tid, device)
        bad_state = bool(d.get("state"))
        if d["outcome"] == "passed" and not bad_state:
            verdicts[tid] = "unexpected pass" if known else "passed"
        elif d["outcome"] == "skipped" and not bad_state:
            verdicts[tid] = "skipped on device"
        elif known and not bad_state:
            verdicts[tid] = "known failure"
        else:
            verdicts[tid] = "unexpected failure"
    for tid, d in dev.items():  # a leak is a defect wherever it happens
        if d.get("state") and tid not in verdicts:
            verdicts[tid] = "unexpected failure"
    return verdicts


def summarize(cpu: dict, dev: dict, verdicts: dict, files, stale=(), device: str = "edref") -> tuple[str, dict]:
    by_file = defaultdict(Counter)
    causes, ops, reasons, unexpected = Counter(), Counter(), Counter(), []
    for tid, v in sorted(verdicts.items()):
        by_file[tid.split("::")[0]][v] += 1
        if v == "known failure":
            reasons[reason_for(tid, device)] += 1
        if v in ("known failure", "unexpected failure"):
            rec = dev[tid]
            causes[cause(rec)] += 1
            if rec.get("op"):
                ops[rec["op"]] += 1
        if v.startswith("unexpected"):
            d = dev[tid]
            unexpected.append(
                (tid, v, cause(d) if v == "unexpected failure" else reason_for(tid, device), d.get("message", ""))
            )
    # only tests both devices instantiate compare (dtypesIfCPU, onlyCPU... make CPU-only ones)
    cpu_passed = sum(1 for t, r in cpu.items() if r["outcome"] == "passed" and t in dev)
    cpu_only = sum(1 for t, r in cpu.items() if r["outcome"] == "passed" and t not in dev)
    passed = sum(1 for v in verdicts.values() if v == "passed")
    known = sum(1 for v in verdicts.values() if v == "known failure")
    data = {
        "device": device,
        "files": list(files),
        "cpu_passed": cpu_passed,
        "cpu_only": cpu_only,
        "device_passed": passed,
        "known_failures": known,
        "skipped_on_device": sum(1 for v in verdicts.values() if v == "skipped on device"),
        "unexpected": [dict(zip(("id", "verdict", "cause", "message"), u)) for u in unexpected],
        "by_file": {f: dict(c) for f, c in by_file.items()},
        "causes": dict(causes.most_common()),
        "ops": dict(ops.most_common()),
        "state_changed": sorted(t for t, d in dev.items() if d.get("state")),
        "known_by_reason": dict(reasons.most_common()),
        "stale_known": list(stale),
    }
    lines = [
        f"# PyTorch's device suites on {device}",
        "",
        f"Command: `python -m tests.devsuites --device {device}` (`make devsuites DEVICE={device}`); "
        f"files: {', '.join(files)} (PyTorch 2.4.0's); "
        f"torch {_torch_version()}.",
        "",
        f"Of {cpu_passed} tests that pass on CPU: {passed} pass on {device}, {known} are known failures "
        f"({100 * known / max(cpu_passed, 1):.1f}%), {data['skipped_on_device']} skip on {device}, "
        f"{len(unexpected)} unexpected. Tests that changed the dispatch state: {len(data['state_changed'])}. "
        f"({cpu_only} CPU passes have no {device} copy: dtypes or decorators for CPU only.)",
        "",
        "| file | "
        + " | ".join(("passed", "known failure", "skipped on device", "unexpected failure", "unexpected pass"))
        + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for f in files:
        c = by_file.get(f, Counter())
        lines.append(
            f"| {f} | "
            + " | ".join(
                str(c[k])
                for k in ("passed", "known failure", "skipped on device", "unexpected failure", "unexpected pass")
            )
            + " |"
        )
    lines += ["", "## Known failures by reason", "", "| reason | tests |", "| --- | ---: |"]
    lines += [f"| {k} | {n} |" for k, n in reasons.most_common()]
    lines += ["", "## Failures by cause", "", "| cause | tests |", "| --- | ---: |"]
    lines += [f"| {k} | {n} |" for k, n in causes.most_common()]
    lines += ["", "## Failures by op", "", "| op | tests |", "| --- | ---: |"]
    lines += [f"| `{k}` | {n} |" for k, n in ops.most_common()]
    if unexpected:
        lines += ["", "## Unexpected", ""]
        lines += [f"- `{t}`: {v} ({c}) {m[:200]}" for t, v, c, m in unexpected]
    if stale:
        lines += ["", "## Known-failure entries that match no test", ""] + [f"- `{p}`" for p in stale]
    return "\n".join(lines) + "\n", data


def _torch_version() -> str:
    import torch

    return torch.__version__


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.devsuites", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=DEVICES, default="edref", help="the reference device (default: edref)")
    p.add_argument("--files", nargs="+", default=list(FILES))
    p.add_argument("--select", help="a file of generic test ids to run (default: every device-type test)")
    p.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers per device")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a single test may run")
    p.add_argument("--out", help="path stem of the .md and .json summary (default: reports/devsuites[-DEVICE])")
    p.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    p.add_argument(
        "--cpu-from",
        help="take the CPU control run from this earlier summary's .json (same torch, files and selection) "
        "instead of running it again: one CPU run serves edref and edprims",
    )
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="devsuites-"))
    try:
        for name in args.files:
            shutil.copy(SOURCE / name, workdir / name)
        (workdir / "pytest.ini").write_text("[pytest]\n")  # no rootdir config above the copy
        select = Path(args.select).resolve() if args.select else None
        wall = {}  # seconds each device's run took, side by side on the same machine
        if args.cpu_from:
            earlier = json.loads(Path(args.cpu_from).read_text())
            cpu = {t: r for t, r in earlier["cpu"].items() if t.split("::")[0] in args.files}
            wall["cpu"] = earlier["summary"].get("wall_s", {}).get("cpu")  # (that run's, if it kept one)
        else:
            t0 = time.perf_counter()
            cpu = run_device("cpu", workdir, args.files, select, args.jobs, args.timeout)
            wall["cpu"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dev = run_device(args.device, workdir, args.files, select, args.jobs, args.timeout)
        wall[args.device] = time.perf_counter() - t0
        verdicts = compare(cpu, dev, args.device)
        stale = [] if select else [p for p in unused(cpu, args.device) if p.split("::")[0] in args.files]
        text, data = summarize(cpu, dev, verdicts, args.files, stale, args.device)
        data["wall_s"] = wall
        if wall["cpu"]:
            text += (
                f"\nWall time, {args.jobs} worker(s) each: CPU {wall['cpu']:.0f} s, {args.device} "
                f"{wall[args.device]:.0f} s ({wall[args.device] / wall['cpu']:.2f}x CPU's).\n"
            )
        out = Path(args.out or default_out(args.device))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(
            json.dumps({"summary": data, "cpu": cpu, args.device: dev}, indent=1, sort_keys=True)
        )
        print(text)
        return 1 if data["unexpected"] or data["state_changed"] or data["stale_known"] else 0
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
