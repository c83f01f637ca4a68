"""Where a training step's time goes on the reference device with the switch, against CPU native.

    python bench/device_profile.py [--steps N] [--perf-steps N] [--json out.json]

For the demo's TransformerBlock and SmallCNN trained with AdamW (as bench/device.py), on edref
with ``ed.enable(dev)`` and on CPU with no mode, one thread:

1. what one warm step calls: the ATen ops a CPU step runs below autograd; the kernels edref runs;
   the calls the switch's C++ fallback served from its table (hits); the calls that entered Python;
2. the step's phases (forward and loss, backward, optimizer), interleaved, medians;
3. autograd's device thread: a device's backward runs on a thread autograd keeps per device
   (CPU's on the calling thread); the edref step with autograd's multithreading off shows what
   that handoff costs here (paired wall-clock ratios, no setting of the user's changed otherwise);
4. one call at 64 elements: a core op on edref vs on CPU (edref's wrapper: host views in, device
   tensors out), and a decomposed op served by the switch vs its one core op called on edref (the
   C++ hit path: key, lookup, program);
5. with ``--perf-steps N`` and Linux ``perf`` on PATH: CPU samples (all threads) of N warm steps on
   each side (in four processes per side, taken in turn), grouped by the code they land in, as
   microseconds per step.
"""

from __future__ import annotations

import argparse
import copy
import os

# NOTE: cold kernel caches, as bench/device.py: the warm-up steps trace, the timed ones hit
os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")
import collections
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from results import Table, add_json_flag, save
from torch.utils._python_dispatch import TorchDispatchMode

from eagerdecomp import device as device_switch
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.device.refdev import op_log, reference_device
from eagerdecomp.runtime import hits

MODELS = {"TransformerBlock": lambda: TransformerBlock(dropout=0.0), "SmallCNN": SmallCNN}
WARMUP = 3


def _setup(name, dev):
    torch.manual_seed(0)
    base = MODELS[name]()
    models = {"cpu": base, "edref": copy.deepcopy(base).to(dev)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    x, y = type(base).batch()
    data = {"cpu": (x, y), "edref": (x.to(dev), y.to(dev))}
    for k in models:
        for _ in range(WARMUP):
            train_step(models[k], opts[k], *data[k])
    return models, opts, data


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args, kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def counts(models, opts, data, runtime) -> tuple:
    """(CPU ATen ops, edref kernels, switch hits, Python entries) of one warm step."""
    with _Count() as c:
        train_step(models["cpu"], opts["cpu"], *data["cpu"])
    routed = lambda: sum(runtime.stats.counts().values())  # noqa: E731
    r0, h0 = routed(), hits.hits_for(runtime.cache)
    with op_log() as ran:
        train_step(models["edref"], opts["edref"], *data["edref"])
    served, found = routed() - r0, hits.hits_for(runtime.cache) - h0
    return c.n, sum(ran.values()), found, served - found


def _phases(model, opt, x, y) -> tuple:
    clock = time.perf_counter
    t0 = clock()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    t1 = clock()
    loss.backward()
    t2 = clock()
    opt.step()
    return t1 - t0, t2 - t1, clock() - t2


def phases(models, opts, data, steps: int) -> list:
    """Per phase (forward+loss, backward, optimizer): (CPU ms, edref ms), medians of interleaved steps."""
    got = {"cpu": [], "edref": []}
    for _ in range(steps):
        for k in got:
            got[k].append(_phases(models[k], opts[k], *data[k]))
    return [tuple(statistics.median(s[i] for s in got[k]) * 1e3 for k in ("cpu", "edref")) for i in range(3)]


def device_thread(models, opts, data, steps: int) -> tuple:
    """Paired wall-clock ratios edref / CPU native: autograd multithreaded (the default), and off."""
    out = []
    for threaded in (True, False):
        ratios = []
        with torch.autograd.set_multithreading_enabled(threaded):
            for _ in range(steps):
                t0 = time.perf_counter()
                train_step(models["cpu"], opts["cpu"], *data["cpu"])
                t1 = time.perf_counter()
                train_step(models["edref"], opts["edref"], *data["edref"])
                ratios.append((time.perf_counter() - t1) / (t1 - t0))
        out.append(statistics.median(ratios))
    return tuple(out)


def _paired(fn_a, fn_b, iters: int = 2000, rounds: int = 9) -> tuple:
    """us per call of each, interleaved round by round: (median a, median b, median of a - b)."""
    for _ in range(100):
        fn_a(), fn_b()
    a, b = [], []
    for _ in range(rounds):
        for fn, out in ((fn_a, a), (fn_b, b)):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(a), statistics.median(b), statistics.median(x - y for x, y in zip(a, b))


def one_call(dev) -> list:
    """(call, us first, us second, us difference, what the difference is) at 64 elements."""
    aten = torch.ops.aten
    a, b = torch.randn(64), torch.randn(64)
    ad, bd = a.to(dev), b.to(dev)
    m = ad.view(8, 8)
    wrapper = "edref's wrapper per kernel"
    return [
        (
            "aten.add.Tensor: edref, CPU",
            *_paired(lambda: aten.add.Tensor(ad, bd), lambda: aten.add.Tensor(a, b)),
            wrapper,
        ),
        (
            "aten.mul.Tensor: edref, CPU",
            *_paired(lambda: aten.mul.Tensor(ad, bd), lambda: aten.mul.Tensor(a, b)),
            wrapper,
        ),
        # NOTE: t is not core ATen: the switch serves it from its table as one permute
        (
            "aten.t through the switch, aten.permute: both on edref",
            *_paired(lambda: aten.t.default(m), lambda: aten.permute.default(m, [1, 0])),
            "the switch's C++ hit per hit",
        ),
    ]


# -- perf ---------------------------------------------------------------------------------------

BUCKETS = [  # (name, test on (library, symbol)); the first that matches
    ("edref's kernel wrapper (csrc/refdev.cpp)", lambda lib, sym: "refdev" in sym),
    ("the switch's C++ fallback: key, lookup, program (csrc/hit.cpp)", lambda lib, sym: lib.startswith("_C.")),
    ("Python (interpreter, torch's bindings)", lambda lib, sym: lib.startswith(("libpython", "libtorch_python"))),
    (
        "dispatcher, boxing, RecordFunction",
        lambda lib, sym: any(
            w in sym for w in ("Dispatcher", "OperatorEntry", "oxed", "IValue", "DispatchKey", "RecordFunction")
        ),
    ),
    (
        "tensor objects (TensorImpl, StorageImpl)",
        lambda lib, sym: any(w in sym for w in ("TensorImpl", "StorageImpl", "intrusive", "VariableVersion")),
    ),
    ("autograd engine", lambda lib, sym: "autograd" in sym),
    ("malloc, libc", lambda lib, sym: lib.startswith(("libc.", "libstdc")) or "malloc" in sym or "free" in sym),
    (
        "ATen kernels (TensorIterator, BLAS, allocation)",
        lambda lib, sym: lib.startswith(("libtorch_cpu", "libc10", "libscipy")),
    ),
    ("kernel (scheduler, thread wake-ups), other", lambda lib, sym: True),
]


def _loop(name: str, side: str, steps: int, ctl: str) -> None:
    """Child of --perf-steps: warm up, then run ``steps`` steps of one side with perf recording."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dev = reference_device()
    device_switch.enable(dev)
    models, opts, data = _setup(name, dev)
    with open(ctl, "w") as f:
        f.write("enable\n")
    for _ in range(steps):
        train_step(models[side], opts[side], *data[side])
    with open(ctl, "w") as f:
        f.write("disable\n")


def perf_buckets(name: str, steps: int, chunks: int = 4, freq: int = 1000) -> dict:
    """{bucket: (CPU us per step, edref us per step)} from perf's samples of each side's steps,
    recorded in ``chunks`` processes per side taken in turn (a machine whose load changes then
    weighs on both sides alike)."""
    out = collections.defaultdict(lambda: [0.0, 0.0])
    per = max(1, steps // chunks)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(chunks):
            for i, side in enumerate(("cpu", "edref")):
                ctl, data = os.path.join(tmp, "ctl"), os.path.join(tmp, f"{side}.data")
                os.mkfifo(ctl)
                record = f"perf record -q -D -1 --control=fifo:{ctl} -F {freq} -o {data}".split()
                loop = [sys.executable, __file__, "--loop", name, side, str(per), ctl]
                subprocess.run(record + loop, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                os.unlink(ctl)
                report = (
                    f"perf report -i {data} --no-children --sort dso,sym -g none --percent-limit 0 --show-nr-samples"
                )
                report = subprocess.run(report.split(), check=True, capture_output=True, text=True).stdout
                for line in report.splitlines():
                    m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[.\]\s+(.*)", line)
                    if m:
                        lib, sym = m.group(2), m.group(3)
                        bucket = next(b for b, test in BUCKETS if test(lib, sym))
                        out[bucket][i] += int(m.group(1)) / freq / (per * chunks) * 1e6
    return dict(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--loop":
        _loop(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30, help="interleaved steps per measurement")
    p.add_argument("--perf-steps", type=int, default=0, help="steps per side under Linux perf (0: no perf table)")
    add_json_flag(p)
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dev = reference_device()
    switch = device_switch.enable(dev)
    t_counts = Table(
        "What one warm training step calls",
        ["model", "CPU: ATen ops", "edref: kernels", "switch: C++ hits", "switch: Python entries"],
    )
    t_phases = Table(
        "Where the step's time goes, ms (medians of interleaved steps)",
        ["model", "phase", "CPU native", "edref + enable", "extra"],
        formats={"CPU native": "{:.2f}", "edref + enable": "{:.2f}", "extra": "{:+.2f}"},
    )
    t_thread = Table(
        "Autograd's device thread: edref + enable / CPU native, per step (paired wall clock)",
        ["model", "autograd threads on (default)", "off (backward on the calling thread)"],
        formats={"autograd threads on (default)": "{:.2f}x", "off (backward on the calling thread)": "{:.2f}x"},
    )
    t_call = Table(
        "One call at 64 elements, us (median)",
        ["call", "first", "second", "difference", "what the difference is"],
        formats={"first": "{:.2f}", "second": "{:.2f}", "difference": "{:+.2f}"},
    )
    t_perf = Table(
        "CPU samples per step by where they land (perf, all threads), us",
        ["model", "where", "CPU native", "edref + enable", "extra"],
        formats={"CPU native": "{:.0f}", "edref + enable": "{:.0f}", "extra": "{:+.0f}"},
    )
    try:
        for name in MODELS:
            models, opts, data = _setup(name, dev)
            t_counts.add(name, *counts(models, opts, data, switch.runtime))
            rows = phases(models, opts, data, args.steps)
            for phase, (c, e) in zip(("forward + loss", "backward", "optimizer (AdamW)"), rows):
                t_phases.add(name, phase, c, e, e - c)
            t_thread.add(name, *device_thread(models, opts, data, args.steps))
        for row in one_call(dev):
            t_call.add(*row)
    finally:
        device_switch.disable(dev)
    tables = [t_counts, t_phases, t_thread, t_call]
    if args.perf_steps:
        if shutil.which("perf") is None:
            print("no perf on PATH: the perf table is left out")
        else:
            for name in MODELS:
                got = perf_buckets(name, args.perf_steps)
                for bucket, (c, e) in sorted(got.items(), key=lambda kv: kv[1][0] - kv[1][1]):
                    t_perf.add(name, bucket, c, e, e - c)
                c, e = (sum(v[i] for v in got.values()) for i in (0, 1))
                t_perf.add(name, "total", c, e, e - c)
            tables.append(t_perf)
    for t in tables:
        print(f"\n{t.title}")
        for row in t.rows:
            print("  " + " | ".join(t.formats.get(col, "{}").format(v) for col, v in zip(t.columns, row)))
    save(args.json, "device_profile", tables)


if __name__ == "__main__":
    main()
