"""torch.compile (Inductor, the default backend) on the reference device edref, against CPU.

    python bench/inductor.py [--steps N] [--threads T] [--json out.json]

For the demo TransformerBlock and SmallCNN (compiled model, cross-entropy, backward, eager
AdamW; edref with ``eagerdecomp.enable`` for what Inductor leaves to kernels): the first step
of a cold compile (dynamo reset, Inductor's caches fresh: compiling C++ included) on CPU, then on
edref, after one discarded round on a tiny model (one-time costs); then ``--steps`` steady steps
alternating CPU and edref, medians and the median of each pair's ratio (a noisy machine slows
both sides of a pair alike). CPU runs attention with the math algorithm, as edref does
(tests/device/test_inductor.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from results import Table, add_json_flag, save
from torch.nn.attention import SDPBackend, sdpa_kernel

from eagerdecomp import device as device_switch
from eagerdecomp.demo import SmallCNN, TransformerBlock
from eagerdecomp.device.refdev import reference_device


def setup(make, batch, device):
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    x, y = (t.to(device) for t in batch)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(compiled(x), y).backward()
        opt.step()

    return step


def first_step(make, batch, device) -> tuple:
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache(), sdpa_kernel(SDPBackend.MATH):
        step = setup(make, batch, device)
        t = time.perf_counter()
        step()
        return step, time.perf_counter() - t


def bench(make, batch, dev, steps: int) -> dict:
    cpu, cpu_first = first_step(make, batch, "cpu")
    edref, edref_first = first_step(make, batch, dev)
    with sdpa_kernel(SDPBackend.MATH):
        cpu(), edref()  # (a second step: the optimizer's state exists)
        times = {"cpu": [], "edref": []}
        for _ in range(steps):
            for name, step in (("cpu", cpu), ("edref", edref)):
                t = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t)
    return {
        "first": (cpu_first, edref_first),
        "steady": (statistics.median(times["cpu"]), statistics.median(times["edref"])),
        "ratio": statistics.median(e / c for c, e in zip(times["cpu"], times["edref"])),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    add_json_flag(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    dev = reference_device()
    table = Table(
        "torch.compile (Inductor) training step on edref vs CPU: first step (cold compile) in s, steady ms",
        ["model", "CPU 1st (s)", "edref 1st (s)", "CPU step (ms)", "edref step (ms)", "edref / CPU"],
        formats={
            "CPU 1st (s)": "{:.1f}",
            "edref 1st (s)": "{:.1f}",
            "CPU step (ms)": "{:.2f}",
            "edref step (ms)": "{:.2f}",
            "edref / CPU": "{:.2f}x",
        },
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steady steps")
    print(f"{'model':18}{'CPU 1st':>9}{'edref 1st':>11}{'CPU step':>11}{'edref step':>12}{'edref/CPU':>11}")
    device_switch.enable(dev)
    try:
        models = [
            ("TransformerBlock", lambda: TransformerBlock(dropout=0.0), TransformerBlock.batch()),
            ("SmallCNN", SmallCNN, SmallCNN.batch()),
        ]
        # one discarded round (process-wide one-time costs: Inductor's imports, its C++ header
        # precompiled on first use), so the first model's CPU column does not carry them
        warm = (
            lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)),
            (torch.randn(2, 4), torch.arange(2)),
        )
        for device in ("cpu", dev):
            first_step(*warm, device)
        for name, make, batch in models:
            r = bench(make, batch, dev, args.steps)
            (cf, ef), (cs, es) = r["first"], r["steady"]
            print(f"{name:18}{cf:>8.1f}s{ef:>10.1f}s{cs * 1e3:>9.2f}ms{es * 1e3:>10.2f}ms{r['ratio']:>10.2f}x")
            table.add(name, cf, ef, cs * 1e3, es * 1e3, r["ratio"])
    finally:
        device_switch.disable(dev)
    save(args.json, "inductor", [table])


if __name__ == "__main__":
    main()
