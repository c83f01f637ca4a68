"""Micro-benchmark: what a decomposed op costs under eagerdecomp.

For each non-core op and size, microseconds per call of:
  native  the op's own kernel, no mode
  naive   its decomposition re-run on every call in a dispatch mode (no cache)
  cached  EagerDecompMode("core_aten"): key, cache hit, replay of the traced kernel
          (in C++ when the library is built: csrc/hit.cpp)
  python  the same mode with the C++ hit path switched off: key, lookup and replay in Python
  floor   the same core ops the kernel runs, called directly with no mode
and the pass-through cost of an opset op: our mode vs a do-nothing TorchDispatchMode.
With --compile inductor, one more column:
  compiled  EagerDecompMode("core_aten", compile="inductor") once its kernel is compiled
            (ops that stay on replay are marked * with the reason), and the compile time.

Variants are timed interleaved, round after round, and ratios are taken per
round then reduced by median, so machine noise hits all variants alike.

    python bench/micro.py [--rounds 15] [--sizes 64,1048576] [--device cpu] [--compile inductor] [--json out.json]
"""

from __future__ import annotations

import argparse
import os

# NOTE: cold kernel caches in every run: no kernel or program from an earlier run's disk cache
os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")
import statistics
import sys
import time

import torch
from results import Table, add_json_flag, save
from torch.utils._python_dispatch import TorchDispatchMode

import eagerdecomp as ed
from eagerdecomp.runtime.compiler import AFTER
from eagerdecomp.runtime.core import runtime_for
from eagerdecomp.runtime.key import make_key
from eagerdecomp.runtime.lift import lift_positions, split, wrapped_positions
from eagerdecomp.runtime.lower import Lowerer

aten = torch.ops.aten


def _call(func, args, kwargs):
    return func(*args, **kwargs)


class DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


DEVICE = "cpu"


def _sync():
    if DEVICE != "cpu":
        torch.accelerator.synchronize()


def cases(n):
    """(name, op, args, kwargs) for ``n`` elements."""
    rows = max(1, n // 64)
    x, y, z = (torch.randn(n, device=DEVICE) for _ in range(3))
    logits = torch.randn(rows, 64, device=DEVICE).log_softmax(-1)
    target = torch.randint(0, 64, (rows,), device=DEVICE)
    sm = torch.randn(rows, 64, device=DEVICE).softmax(-1)
    return [
        ("addcmul", aten.addcmul.default, (x, y, z), {"value": 0.5}),
        ("silu", aten.silu.default, (x,), {}),
        ("hardswish", aten.hardswish.default, (x,), {}),
        ("logaddexp", aten.logaddexp.default, (x, y), {}),
        ("softplus", aten.softplus.default, (x, 2.0, 20.0), {}),
        ("mse_loss", aten.mse_loss.default, (x, y), {}),
        ("huber_loss", aten.huber_loss.default, (x, y), {}),
        ("glu", aten.glu.default, (torch.randn(rows, 128, device=DEVICE), -1), {}),
        ("elu_backward", aten.elu_backward.default, (y, 1.0, 1.0, 1.0, False, x), {}),
        (
            "_softmax_backward_data",
            aten._softmax_backward_data.default,
            (y.view(rows, -1), sm.view(rows, -1), -1, torch.float32),
            {},
        ),
        ("nll_loss_forward", aten.nll_loss_forward.default, (logits, target, None, 1, -100), {}),
        ("transpose (view)", aten.transpose.int, (torch.randn(rows, 64, device=DEVICE), 0, 1), {}),
        ("lerp", aten.lerp.Scalar, (x, y, 0.3), {}),
        ("add_ (in-place)", aten.add_.Tensor, (x.clone(), y), {}),
        ("addcmul_ (in-place)", aten.addcmul_.default, (x.clone(), y, z), {"value": 0.5}),
        ("lerp_ (in-place)", aten.lerp_.Scalar, (x.clone(), y, 0.3), {}),
        ("hardswish_ (in-place)", aten.hardswish_.default, (x.clone(),), {}),
    ]


def _per_call(batch, iters):
    _sync()
    t0 = time.perf_counter()
    batch(iters)
    _sync()
    return (time.perf_counter() - t0) / iters * 1e6


def _iters_for(fn, budget=0.01):
    t = _per_call(fn, 3) / 1e6
    return max(3, min(2000, int(budget / max(t, 1e-7))))


class Capture(TorchDispatchMode):
    """Records the first call exactly as a dispatch mode receives it (defaults stripped)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.__dict__.setdefault("seen", (func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def bench_op(op, args, kwargs, rounds, compile=None):
    runtime = runtime_for("core_aten")
    mode = ed.EagerDecompMode("core_aten")
    with mode, Capture() as cap:
        op(*args, **kwargs)  # trace once
    # the key exactly as the runtime builds it: floats of pointwise ops are lifted out of
    # the key and passed to the kernel as inputs (eagerdecomp/lift.py)
    func, cargs, ckwargs = cap.seen
    positions = lift_positions(func) + wrapped_positions(func)
    cargs, ckwargs, lifted = split(positions, cargs, ckwargs) if positions else (cargs, ckwargs, [])
    key, tensors = make_key(func, cargs, ckwargs)
    tensors = tensors + [v for _, v in lifted]
    kernel = runtime.cache.get(key)
    naive = Lowerer(runtime.opset, runtime.table, _call)

    # each variant is a whole timed batch; modes are entered once per batch, as a program would
    def native(n):
        for _ in range(n):
            op(*args, **kwargs)

    def run_naive(n):
        with naive:
            for _ in range(n):
                op(*args, **kwargs)

    def cached(n):
        with mode:
            for _ in range(n):
                op(*args, **kwargs)

    def floor(n):
        fn = kernel.module.forward  # (made now if the kernel deferred it)
        for _ in range(n):
            fn(*tensors)

    py_mode = ed.EagerDecompMode("core_aten")
    py_mode.runtime.hits = py_mode.runtime.stats.hits = None  # the pure-Python hit path

    def python(n):
        with py_mode:
            for _ in range(n):
                op(*args, **kwargs)

    variants = {"native": native, "naive": run_naive, "cached": cached, "python": python, "floor": floor}
    row = None
    if compile:
        fused = ed.EagerDecompMode("core_aten", compile=compile)
        with fused:
            for _ in range(AFTER + 2):  # trace, replays, compile: answered compiled from here
                op(*args, **kwargs)
        row = fused.report().row(func)

        def compiled(n):
            with fused:
                for _ in range(n):
                    op(*args, **kwargs)

        variants["compiled"] = compiled
    iters = {k: _iters_for(f) for k, f in variants.items()}
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            samples[k].append(_per_call(f, iters[k]))
    return samples, row


def ratio(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def bench_passthrough(rounds, n=64):
    x = torch.randn(n, device=DEVICE)
    ours, nothing = ed.EagerDecompMode("core_aten"), DoNothing()

    def via(mode):
        def batch(n):
            with mode:
                for _ in range(n):
                    aten.mul.Tensor(x, x)

        return batch

    a, b = [], []
    for _ in range(rounds):
        a.append(_per_call(via(ours), 2000))
        b.append(_per_call(via(nothing), 2000))
    return a, b


def bench_profiler_check(rounds, n=64):
    """The hot path's only cost when no profiler runs: eagerdecomp.observe.profiling(),
    against a whole cached hit of silu under the mode (both us per call)."""
    from eagerdecomp.runtime.observe import profiling

    x, mode = torch.randn(n, device=DEVICE), ed.EagerDecompMode("core_aten")

    def hits(n):
        with mode:
            for _ in range(n):
                aten.silu.default(x)

    def checks(n):
        for _ in range(n):
            profiling()

    hits(10)  # trace once
    a, b = [], []
    for _ in range(rounds):
        a.append(_per_call(checks, 20000))
        b.append(_per_call(hits, 2000))
    return a, b


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", default="64,1048576")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, ...: where the tensors live")
    ap.add_argument("--compile", choices=["inductor"], help="add a column: the mode with compile=")
    add_json_flag(ap)
    opts = ap.parse_args(argv)
    global DEVICE
    DEVICE = opts.device
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread: ratios are not skewed by how many cores are free
    results = []
    print(
        f"eagerdecomp {ed.__version__}, torch {torch.__version__}, {opts.device}, {opts.rounds} rounds, 1 thread; "
        "us per call (median)"
    )
    head = (
        f"{'op':24} {'numel':>8} {'native':>9} {'naive':>9} {'cached':>9} {'python':>9} {'floor':>9} "
        f"{'naive/cached':>13} {'python/cached':>14} {'cached/floor':>13}"
    )
    if opts.compile:
        head += f" {'compiled':>9} {'comp/native':>12} {'comp/cached':>12} {'compile s':>9}"
    notes = []
    print(head)
    print("-" * len(head))
    for n in map(int, opts.sizes.split(",")):
        for name, op, args, kwargs in cases(n):
            s, rep = bench_op(op, args, kwargs, opts.rounds, opts.compile)
            med = {k: statistics.median(v) for k, v in s.items()}
            row = dict(
                op=name,
                numel=n,
                **med,
                naive_over_cached=ratio(s["naive"], s["cached"]),
                python_over_cached=ratio(s["python"], s["cached"]),
                cached_over_floor=ratio(s["cached"], s["floor"]),
            )
            line = (
                f"{name:24} {n:>8} {med['native']:9.1f} {med['naive']:9.1f} {med['cached']:9.1f} {med['python']:9.1f} "
                f"{med['floor']:9.1f} {row['naive_over_cached']:12.2f}x {row['python_over_cached']:13.2f}x "
                f"{row['cached_over_floor']:12.2f}x"
            )
            if opts.compile:
                row.update(
                    compiled_over_native=ratio(s["compiled"], s["native"]),
                    compiled_over_cached=ratio(s["compiled"], s["cached"]),
                    compile_s=rep.compile_s,
                    is_compiled=bool(rep.compiled),
                    not_compiled=rep.not_compiled,
                )
                mark = " " if rep.compiled else "*"
                if not rep.compiled:
                    notes.append(f"* {name} ({n}): not compiled: {'; '.join(rep.not_compiled) or '?'}")
                line += (
                    f" {med['compiled']:8.1f}{mark} {row['compiled_over_native']:11.2f}x "
                    f"{row['compiled_over_cached']:11.2f}x {rep.compile_s:9.2f}"
                )
            results.append(row)
            print(line)
    for note in dict.fromkeys(notes):
        print(note)
    a, b = bench_passthrough(opts.rounds)
    pt = ratio(a, b)
    print(
        f"\npass-through aten.mul.Tensor (64 elements): ours {statistics.median(a):.2f} us, "
        f"do-nothing mode {statistics.median(b):.2f} us, ratio {pt:.2f}x"
    )
    c, h = bench_profiler_check(opts.rounds)
    print(
        f"profiler check with no profiler running: {1e3 * statistics.median(c):.0f} ns per call, "
        f"{100 * ratio(c, h):.2f}% of a cached silu hit ({statistics.median(h):.2f} us)"
    )
    for n in map(int, opts.sizes.split(",")):
        rows = [x for x in results if x["numel"] == n]
        print(
            f"numel {n}: median naive/cached {statistics.median(x['naive_over_cached'] for x in rows):.2f}x "
            f"(min {min(x['naive_over_cached'] for x in rows):.2f}x), "
            f"median python/cached {statistics.median(x['python_over_cached'] for x in rows):.2f}x, "
            f"median cached/floor {statistics.median(x['cached_over_floor'] for x in rows):.2f}x"
        )
        done = [x for x in rows if x.get("is_compiled")]
        if done:
            worst = max(done, key=lambda x: x["compiled_over_native"])
            print(
                f"numel {n}: compiled ops {len(done)}/{len(rows)}, worst compiled/native "
                f"{worst['compiled_over_native']:.2f}x ({worst['op']}), worst compiled/cached of all "
                f"{max(x['compiled_over_cached'] for x in rows):.2f}x"
            )
    per_op = Table(
        "A decomposed op, us per call (median); cached = EagerDecompMode('core_aten') on a cache hit",
        [
            "op",
            "numel",
            "native",
            "naive",
            "cached",
            "python",
            "floor",
            "naive / cached",
            "python / cached",
            "cached / floor",
        ],
        formats={c: "{:.1f}" for c in ("native", "naive", "cached", "python", "floor")}
        | {c: "{:.2f}x" for c in ("naive / cached", "python / cached", "cached / floor")},
    )
    for r in results:
        per_op.add(
            r["op"],
            r["numel"],
            r["native"],
            r["naive"],
            r["cached"],
            r["python"],
            r["floor"],
            r["naive_over_cached"],
            r["python_over_cached"],
            r["cached_over_floor"],
        )
    summary = Table(
        "A decomposed op: medians over the per-op table of docs/performance.md",
        ["numel", "naive / cached", "python / cached", "cached / floor"],
        formats={c: "{:.2f}x" for c in ("naive / cached", "python / cached", "cached / floor")},
        notes=[f"Pass-through of a core op (aten.mul.Tensor, 64 elements): {pt:.2f}x a do-nothing TorchDispatchMode."],
    )
    for n in map(int, opts.sizes.split(",")):
        rows = [x for x in results if x["numel"] == n]
        summary.add(
            n,
            *(
                statistics.median(x[k] for x in rows)
                for k in ("naive_over_cached", "python_over_cached", "cached_over_floor")
            ),
        )
    save(opts.json, "micro", [summary, per_op], opts.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
