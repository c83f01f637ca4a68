"""Time per training step on the reference device with the device switch, against CPU.

    python bench/device.py [--steps N] [--rounds R] [--json out.json]

For the demo TransformerBlock and SmallCNN (forward, cross-entropy, backward, AdamW):
CPU native; CPU under EagerDecompMode("core_aten"); edref (core ATen kernels that run
the CPU kernel on host memory) with ``eagerdecomp.enable``. Steps alternate
between the three in one run (one thread unless ``--threads``); medians of the steady state
(first step excluded: it traces), and the ratios as medians of each step's own ratio (the
steps of one round run back to back, so a noisy machine slows both sides of a ratio alike).
edref's own cost (re-wrapping tensors per kernel) is included: it is the price of a
device, not of eagerdecomp, so the last column is edref with eagerdecomp vs CPU native.

Then the cost of one decomposed op's hit on edref (64 elements): the op called with the
switch on (the C++ fallback finds the key's program and runs its core ops) against its
core ops called directly (the op's cached kernel, a Python function of aten calls, on
the same edref tensors); interleaved rounds, medians, and the difference per call.
"""

from __future__ import annotations

import argparse
import copy
import os

# NOTE: cold kernel caches in every run: the first step's time is tracing, not loading the disk
# cache a previous run left, and the per-op table below finds the kernel this run traced
os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")
import statistics
import time
import warnings

import torch
from results import Table, add_json_flag, save

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.device.refdev import reference_device


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
    out = {k: (v[0], statistics.median(v[1:])) for k, v in times.items()}
    for k in ("mode", "edref"):  # paired: each step's ratio to the native step just before it
        out[k + "/native"] = statistics.median(a / b for a, b in zip(times[k][1:], times["native"][1:]))
    return out


def _per_call(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_hits(dev, runtime, rounds: int, iters: int = 400) -> list:
    """(op, switch us, core ops us, us over) for each op of bench/micro.py at 64 elements."""
    import micro

    from eagerdecomp.runtime.key import make_key
    from eagerdecomp.runtime.lift import lift_positions, split, wrapped_positions
    from eagerdecomp.runtime.tiers import trace_after

    micro.DEVICE = dev
    rows = []
    for name, op, args, kwargs in micro.cases(64):
        with micro.Capture() as cap:
            op(*args, **kwargs)  # the first miss (run direct while the key is cold: tiers.py)
        for _ in range(trace_after() + 1):  # the key traced, replayed, its program installed
            op(*args, **kwargs)
        func, cargs, ckwargs = cap.seen
        positions = lift_positions(func) + wrapped_positions(func)
        cargs, ckwargs, lifted = split(positions, cargs, ckwargs) if positions else (cargs, ckwargs, [])
        key, tensors = make_key(func, cargs, ckwargs)
        # the fallback's key holds the boxed call's defaults; the op has one shape here
        kernel = runtime.cache.get(key) or next(iter(runtime.cache.kernels_of(func, 1)), None)
        if kernel is None or not hasattr(kernel, "module"):
            rows.append((name, None, None, None))
            continue
        core = kernel.module.forward  # (made now if the kernel deferred it)
        tensors = tensors + [v for _, v in lifted]
        a, b = [], []
        for _ in range(rounds):
            a.append(_per_call(lambda: op(*args, **kwargs), iters))
            b.append(_per_call(lambda: core(*tensors), iters))
        hit, floor = statistics.median(a), statistics.median(b)
        rows.append((name, hit, floor, statistics.median(x - y for x, y in zip(a, b))))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=9, help="rounds of the per-op hit table")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the training steps")
    add_json_flag(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    dev = reference_device()
    load_s = time.perf_counter() - t0
    from eagerdecomp.runtime import library as _ext

    st = _ext.status()
    built = f", just-in-time build {st['build_s']:.0f} s" if st["build_s"] else ""
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads | edref from {st['loaded']} library "
        f"(reference_device() {load_s:.1f} s{built}) | {args.steps} steps, medians after the first\n"
    )
    steps = Table(
        "Training step (AdamW) on the reference device with the switch, ms per step (median after the first)",
        ["model", "CPU native", "CPU + mode", "edref + enable", "edref 1st step", "mode / native", "edref / native"],
        formats={
            "CPU native": "{:.1f}",
            "CPU + mode": "{:.1f}",
            "edref + enable": "{:.1f}",
            "edref 1st step": "{:.0f}",
            "mode / native": "{:.2f}x",
            "edref / native": "{:.2f}x",
        },
    )
    hits = Table(
        "One decomposed op on edref (64 elements, 1 thread): us per call (median)",
        ["op", "switch hit", "core ops", "hit - core"],
        formats={"switch hit": "{:.2f}", "core ops": "{:.2f}", "hit - core": "{:+.2f}"},
    )
    device_switch.enable(dev)
    try:
        print(
            f"{'model':18}{'CPU native':>12}{'CPU+mode':>12}{'edref+enable':>14}"
            f"{'edref 1st':>11}{'mode/native':>13}{'edref/native':>14}"
        )
        for name, make in [("TransformerBlock", lambda: TransformerBlock(dropout=0.0)), ("SmallCNN", SmallCNN)]:
            r = bench(make, dev, args.steps)
            n, m, d = r["native"][1], r["mode"][1], r["edref"][1]
            print(
                f"{name:18}{n * 1e3:>10.1f}ms{m * 1e3:>10.1f}ms{d * 1e3:>12.1f}ms{r['edref'][0] * 1e3:>9.0f}ms"
                f"{r['mode/native']:>12.2f}x{r['edref/native']:>13.2f}x"
            )
            steps.add(name, n * 1e3, m * 1e3, d * 1e3, r["edref"][0] * 1e3, r["mode/native"], r["edref/native"])
        print(f"\none decomposed op on edref, 64 elements, 1 thread, {args.rounds} rounds: us per call (median)")
        print(f"{'op':24}{'switch hit':>12}{'core ops':>10}{'hit - core':>12}")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            rows = bench_hits(dev, device_switch.enabled(dev).runtime, args.rounds)
        finally:
            torch.set_num_threads(threads)
        for name, hit, floor, over in rows:
            if hit is None:
                print(f"{name:24}{'(no kernel: not decomposed on edref)':>34}")
            else:
                print(f"{name:24}{hit:>12.2f}{floor:>10.2f}{over:>+12.2f}")
                hits.add(name, hit, floor, over)
        done = [r for r in rows if r[1] is not None]
        print(
            f"worst hit - core: {max(r[3] for r in done):+.2f} us ({max(done, key=lambda r: r[3])[0]}); "
            f"C++ hit path: {'on' if device_switch.enabled(dev).runtime.hits is not None else 'off (pure Python)'}"
        )
    finally:
        device_switch.disable(dev)
    save(args.json, "device", [steps, hits])


if __name__ == "__main__":
    main()
