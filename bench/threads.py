"""Several threads training at once, against the same training done alone, natively.

Each of ``--threads`` threads trains its own MLP (Linear 32->64, GELU, LayerNorm, Linear 64->10;
loss ``logsumexp(-1).mean()``; 30 batches of 8-12 rows; AdamW) under its own
``EagerDecompMode("core_aten")``, from a fresh kernel cache each round; every loss is compared
with the same training run alone in the main thread, with no mode. Prints how many thread-runs
differed (max |loss difference| above 1e-4).

    python bench/threads.py [--rounds 100] [--threads 4] [--native] [--pytorch-pitfalls] [--json out.json]

``--native`` runs the threads without eagerdecomp (the control). ``--pytorch-pitfalls`` builds
each model inside its thread after ``torch.manual_seed`` (weights drawn from the shared default
generator) and leaves the threads' intra-op thread count as PyTorch sets it: the two PyTorch
behaviours that make threads differ from a run alone with or without eagerdecomp.
"""

from __future__ import annotations

import argparse
import contextlib
import threading

import torch
from results import Table, add_json_flag, save

import eagerdecomp as ed


def batches(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8 + int(torch.randint(0, 5, (), generator=g)), 32, generator=g) for _ in range(30)]


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)
    )


def train(model, data, mode=None) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with mode if mode is not None else contextlib.nullcontext():
        for x in data:
            loss = model(x).logsumexp(-1).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses


def one_round(seeds: list, native: bool, pitfalls: bool) -> list:
    """Max |loss difference| per thread, against the same training alone in this thread."""
    data = {s: batches(s) for s in seeds}
    want = {s: train(build(s), data[s]) for s in seeds}
    models = {} if pitfalls else {s: build(s) for s in seeds}
    got = {}

    def body(s):
        if not pitfalls:
            torch.set_num_threads(1)  # NOTE: a new thread does not inherit the main thread's setting
        model = build(s) if pitfalls else models[s]
        got[s] = train(model, data[s], None if native else ed.EagerDecompMode("core_aten"))

    threads = [threading.Thread(target=body, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [max(abs(a - b) for a, b in zip(want[s], got[s])) for s in seeds]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--native", action="store_true", help="threads without eagerdecomp (the control)")
    ap.add_argument(
        "--pytorch-pitfalls",
        action="store_true",
        help="models built in the threads, intra-op threads as PyTorch sets them",
    )
    add_json_flag(ap)
    opts = ap.parse_args(argv)
    torch.set_num_threads(1)
    wrong = total = 0
    worst = 0.0
    for r in range(opts.rounds):
        ed.cache_clear()
        diffs = one_round([1000 * r + i for i in range(opts.threads)], opts.native, opts.pytorch_pitfalls)
        total += len(diffs)
        wrong += sum(d > 1e-4 for d in diffs)
        worst = max(worst, *diffs)
    what = "native threads" if opts.native else "threads under EagerDecompMode('core_aten')"
    print(
        f"{what}{' (PyTorch pitfalls on)' if opts.pytorch_pitfalls else ''}: "
        f"{wrong} of {total} thread-runs differ from the same training alone (worst max |diff| {worst:.2e})"
    )
    table = Table(
        "Threads training at once against the same training alone",
        ["threads", "variant", "thread-runs", "differ (max |loss diff| > 1e-4)", "worst max |loss diff|"],
        formats={"worst max |loss diff|": "{:.1e}"},
    )
    variant = ("natively" if opts.native else "under the mode") + (
        ", models built in the threads, intra-op threads as PyTorch sets them" if opts.pytorch_pitfalls else ""
    )
    table.add(opts.threads, variant, total, wrong, worst)
    save(opts.json, "threads", [table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
