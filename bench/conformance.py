"""The OpInfo conformance suite's verdicts as result tables the docs render.

Runs the suite (the fast slice of ``make test``, or with ``--full`` what ``make conformance``
runs) and turns the summary it writes (``reports/conformance[-fast].json``) into two tables:
samples per class, and per variant (functional, in-place, ``out=``, gradients).

    python bench/conformance.py [--full] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from results import Table, add_json_flag, save

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("pass", "pass-native", "unsupported", "wrong", "error")
VARIANTS = {"fn": "functional", "inplace": "in-place", "out": "out=", "grad": "gradients (float64)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every sample at every dtype (make conformance: hours)")
    ap.add_argument("--jobs", default="2", help="pytest-xdist workers")
    add_json_flag(ap)
    opts = ap.parse_args(argv)
    env = dict(os.environ, EAGERDECOMP_CONFORMANCE="full" if opts.full else "")
    cmd = [sys.executable, "-m", "pytest", "tests/conformance/test_opinfo.py", "-q", "-n", opts.jobs]
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    written = ROOT / "reports" / ("conformance.json" if opts.full else "conformance-fast.json")
    summary = json.loads(written.read_text())
    meta = summary["meta"]
    counts = Table(
        f"OpInfo samples under EagerDecompMode('core_aten'), by verdict ({meta['scope']})",
        ["verdict", "samples"],
        notes=[
            f"Of the samples whose op has a path to core ATen, {100 * meta['pass_rate_with_path']:.2f}% pass exactly. "
            "pass: decomposed (or bypassed) and equal to eager; pass-native: only core ops were needed; "
            "unsupported: no path to core ATen, the blocking op named (tests/conformance/xfail.py)."
        ],
    )
    for c in CLASSES:
        counts.add(c, meta["counts"][c])
    counts.add("total", meta["samples"])
    variants = Table("The same samples by variant", ["variant", *CLASSES])
    for v, label in VARIANTS.items():
        variants.add(label, *(meta["by_variant"].get(f"{v}:{c}", 0) for c in CLASSES))
    save(opts.json, "conformance", [counts, variants])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
