"""Benchmark: torch.compile with backend="eagerdecomp" against aot_eager, on a tiny network
with graph breaks (an explicit break, a data-dependent branch, a region dynamo never captures),
trained with AdamW.

After one discarded round (process-wide one-time costs: imports, dynamo's first use), per
configuration, per round: a cold start (dynamo reset, eagerdecomp's kernel cache cleared, fresh
model), the first training step timed (compile + first run: "first step"), two untimed steps,
then ``--steps`` steps timed one by one (median: "steady step"). Configurations run one after
the other inside each round, so machine noise hits them alike; ratios to aot_eager are taken
per round, then reduced by median.

  native eager          no compile, no mode (the floor)
  aot_eager             torch.compile(backend="aot_eager"), no mode: eager regions run natively
  aot_eager + mode      the same under EagerDecompMode: the mode decomposes the graphs' non-core
                        ops at run time, and the eager regions
  eagerdecomp, no mode  compile_backend("core_aten") alone: graphs lowered at compile time,
                        eager regions native (what the lowering costs)
  eagerdecomp + mode    compile_backend("core_aten") under EagerDecompMode: graphs lowered at
                        compile time (the mode only passes their ops through), eager regions
                        decomposed by the mode: only core ATen runs

    python bench/compile.py [--rounds 5] [--steps 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.dynamo.backend import compile_backend


@torch.compiler.disable
def eager_tail(x):
    return F.softplus(x) + F.hardswish(x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        h = F.gelu(self.norm(self.fc1(x)))
        if h.mean() > 0:
            h = F.silu(h)
        else:
            h = F.mish(h)
        torch._dynamo.graph_break()
        return self.fc2(eager_tail(h))


WARMUP = 2


def configs():
    """name -> (backend or None for no compile, context manager factory)."""
    mode = lambda: ed.EagerDecompMode("core_aten")  # noqa: E731
    return {
        "native eager": (None, contextlib.nullcontext),
        "aot_eager": ("aot_eager", contextlib.nullcontext),
        "aot_eager + mode": ("aot_eager", mode),
        "eagerdecomp, no mode": (lambda: compile_backend("core_aten"), contextlib.nullcontext),
        "eagerdecomp + mode": (lambda: compile_backend("core_aten"), mode),
    }


def run(base, backend, ctx, x, y, steps):
    torch._dynamo.reset()
    ed.cache_clear()
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if backend is not None:
        fn = torch.compile(model, backend=backend() if callable(backend) else backend)
    else:
        fn = model

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(fn(x), y)
        loss.backward()
        opt.step()
        return loss

    with ctx():
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        for _ in range(WARMUP):  # step-dependent floats (AdamW) settle into lifted kernels
            step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = Net()
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    table = configs()
    results = {name: [] for name in table}
    for backend, ctx in table.values():  # one discarded round: process-wide one-time costs
        run(base, backend, ctx, x, y, 1)
    for _ in range(args.rounds):
        for name, (backend, ctx) in table.items():
            results[name].append(run(base, backend, ctx, x, y, args.steps))

    def ratio(name, i):
        return statistics.median(r[i] / a[i] for r, a in zip(results[name], results["aot_eager"]))

    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds x {args.steps} steps; "
        "medians; ratios to aot_eager are medians of per-round ratios"
    )
    print(
        f"{'configuration':22} {'first step (s)':>15} {'steady step (ms)':>17} {'first / aot_eager':>18} "
        f"{'steady / aot_eager':>19}"
    )
    for name, rows in results.items():
        first = statistics.median(r[0] for r in rows)
        steady = statistics.median(r[1] for r in rows) * 1e3
        print(f"{name:22} {first:15.3f} {steady:17.2f} {ratio(name, 0):17.2f}x {ratio(name, 1):18.2f}x")


if __name__ == "__main__":
    main()
