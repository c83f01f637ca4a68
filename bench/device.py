"""Time per training step on the reference device with the device switch, against CPU.

    python bench/device.py [--steps N]

For the demo TransformerBlock and SmallCNN (forward, cross-entropy, backward, AdamW):
CPU native; CPU under EagerDecompMode("core_aten"); edref (core ATen kernels that run
the CPU kernel on host memory) with ``eagerdecomp.backend.enable``. Steps alternate
between the three in one run; medians of the steady state (first step excluded: it traces).
edref's own cost (re-wrapping tensors per kernel) is included: it is the price of a
device, not of eagerdecomp, so the last column is edref with eagerdecomp vs CPU native.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch

import eagerdecomp as ed
from eagerdecomp import backend
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.refdev import reference_device


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(make, dev, steps: int) -> dict:
    torch.manual_seed(0)
    base = make()
    models = {"native": base, "mode": copy.deepcopy(base), "edref": copy.deepcopy(base).to(dev)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    x, y = type(base).batch()
    xd, yd = x.to(dev), y.to(dev)
    times = {k: [] for k in models}
    for _ in range(steps):
        times["native"].append(_timed(lambda: train_step(models["native"], opts["native"], x, y)))
        with ed.EagerDecompMode("core_aten"):
            times["mode"].append(_timed(lambda: train_step(models["mode"], opts["mode"], x, y)))
        times["edref"].append(_timed(lambda: train_step(models["edref"], opts["edref"], xd, yd)))
    return {k: (v[0], statistics.median(v[1:])) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    dev = reference_device()
    load_s = time.perf_counter() - t0
    from eagerdecomp import _ext

    st = _ext.status()
    built = f", just-in-time build {st['build_s']:.0f} s" if st["build_s"] else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads | edref from {st['loaded']} library "
          f"(reference_device() {load_s:.1f} s{built}) | {args.steps} steps, medians after the first\n")
    backend.enable(dev)
    try:
        print(f"{'model':18}{'CPU native':>12}{'CPU+mode':>12}{'edref+enable':>14}{'edref 1st':>11}{'mode/native':>13}{'edref/native':>14}")
        for name, make in [("TransformerBlock", lambda: TransformerBlock(dropout=0.0)), ("SmallCNN", SmallCNN)]:
            r = bench(make, dev, args.steps)
            n, m, d = r["native"][1], r["mode"][1], r["edref"][1]
            print(f"{name:18}{n * 1e3:>10.1f}ms{m * 1e3:>10.1f}ms{d * 1e3:>12.1f}ms{r['edref'][0] * 1e3:>9.0f}ms"
                  f"{m / n:>12.1f}x{d / n:>13.1f}x")
    finally:
        backend.disable(dev)


if __name__ == "__main__":
    main()
