"""A whole training step (the demo's models, AdamW) under each way of running it.

    python bench/step.py [--device cpu|cuda] [--rounds 15] [--scale 1] [--no-compile] [--foreach] [--json out.json]

Variants, timed interleaved round after round (ratios per round, then medians):
  native     no mode
  nothing    a do-nothing TorchDispatchMode: the floor of any Python mode
  mode       EagerDecompMode("core_aten")
  compiled   EagerDecompMode("core_aten", compile="inductor"), after its warm-up compiles
Every variant trains its own copy of the model from the same weights on the same batch
(dropout off), and the parameters after the steps are compared with native's.
``--scale`` multiplies the batch (and the block's width) to move from overhead-bound to
compute-bound steps. ``--foreach`` makes AdamW take its ``_foreach_*`` path (``foreach=True``,
the default on CUDA), whose per-step bias corrections arrive as lists of floats.
"""

from __future__ import annotations

import argparse
import os

# NOTE: cold kernel caches in every run: no kernel or program from an earlier run's disk cache
os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")
import copy
import statistics
import sys
import time
import warnings

import torch
from results import Table, add_json_flag, save
from torch.utils._python_dispatch import TorchDispatchMode

import eagerdecomp as ed
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.runtime.compiler import AFTER


class DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _models(scale, device):
    torch.manual_seed(0)
    block = TransformerBlock(dim=32 * scale, dropout=0.0).to(device)
    cnn = SmallCNN().to(device)
    return {
        "TransformerBlock": (block, TransformerBlock.batch(n=8 * scale, dim=32 * scale, device=device)),
        "SmallCNN": (cnn, SmallCNN.batch(n=4 * scale, device=device)),
    }


def bench(name, model, batch, device, rounds, compile, foreach=None, table=None):
    sync = torch.accelerator.synchronize if device != "cpu" else (lambda: None)
    modes = {"native": _Null, "nothing": DoNothing, "mode": lambda: ed.EagerDecompMode("core_aten")}
    if compile:
        modes["compiled"] = lambda: ed.EagerDecompMode("core_aten", compile="inductor")
    runs = {}
    for k, make in modes.items():
        m = copy.deepcopy(model)
        runs[k] = (make(), m, torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=foreach))
    x, y = batch
    t_warm = {}
    for k, (mode, m, opt) in runs.items():  # warm-up: traces, and for compiled its compiles
        t0 = time.perf_counter()
        for _ in range(AFTER + 3):
            with mode:
                train_step(m, opt, x, y)
        sync()
        t_warm[k] = time.perf_counter() - t0
    misses = lambda: sum(r.misses for r in runs["mode"][0].report().rows)  # noqa: E731
    before = misses()
    samples = {k: [] for k in runs}
    for _ in range(rounds):
        for k, (mode, m, opt) in runs.items():
            sync()
            t0 = time.perf_counter()
            with mode:
                train_step(m, opt, x, y)
            sync()
            samples[k].append(time.perf_counter() - t0)
    ref = list(runs["native"][1].parameters())
    diff = {k: max((a - b).abs().max().item() for a, b in zip(ref, m.parameters())) for k, (_, m, _) in runs.items()}
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(samples[a], samples[b]))  # noqa: E731
    line = (
        f"{name:17} native {med['native']:7.2f} ms | nothing {med['nothing']:7.2f} | mode {med['mode']:7.2f} "
        f"({ratio('mode', 'native'):.2f}x native, {ratio('mode', 'nothing'):.2f}x nothing)"
    )
    if "compiled" in runs:
        rep = runs["compiled"][0].report()
        n = sum(1 for r in rep.rows if r.compiled)
        line += (
            f" | compiled {med['compiled']:7.2f} ({ratio('compiled', 'mode'):.2f}x mode; {n} ops compiled, "
            f"warm-up {t_warm['compiled']:.1f} s)"
        )
    print(line)
    if table is not None:
        table.add(
            name,
            med["native"],
            med["nothing"],
            med["mode"],
            ratio("mode", "native"),
            ratio("mode", "nothing"),
            med.get("compiled"),
            ratio("compiled", "mode") if "compiled" in runs else None,
            max(v for k, v in diff.items() if k != "native"),
        )
    print(
        f"{'':17} params vs native after {AFTER + 3 + rounds} steps: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diff.items() if k != "native")
        + f"; mode traced {misses() - before} kernel(s) in the timed rounds"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--foreach", action="store_true", help="AdamW(foreach=True) (the default on CUDA)")
    add_json_flag(ap)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    print(
        f"eagerdecomp {ed.__version__}, torch {torch.__version__}, {opts.device}, {opts.threads} thread(s), "
        f"scale {opts.scale}, {opts.rounds} rounds{', AdamW foreach=True' if opts.foreach else ''}; "
        "ms per training step (median)"
    )
    table = Table(
        "Training step (AdamW), ms per step, median of interleaved rounds",
        [
            "model",
            "native",
            "do-nothing mode",
            "EagerDecompMode",
            "mode / native",
            "mode / do-nothing",
            "compile=inductor",
            "compiled / mode",
            "max param diff",
        ],
        formats={
            "native": "{:.2f}",
            "do-nothing mode": "{:.2f}",
            "EagerDecompMode": "{:.2f}",
            "mode / native": "{:.2f}x",
            "mode / do-nothing": "{:.2f}x",
            "compile=inductor": "{:.2f}",
            "compiled / mode": "{:.2f}x",
            "max param diff": "{:.1e}",
        },
        notes=[
            "max param diff: the largest |difference| from native's parameters after every step of the run. "
            "AdamW divides each update by the gradient's running norm, so where the exact gradient is 0 "
            "(attention's key bias) a rounding-level gradient becomes an update of up to lr per step."
        ],
    )
    for name, (model, batch) in _models(opts.scale, opts.device).items():
        bench(name, model, batch, opts.device, opts.rounds, not opts.no_compile, True if opts.foreach else None, table)
    save(opts.json, "step", [table], opts.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
