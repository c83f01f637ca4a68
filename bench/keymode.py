"""The mode on its C++ dispatch key against its Python path, native and a do-nothing Python mode.

    python bench/keymode.py [--rounds 15] [--json out.json]

One process, every variant timed interleaved round after round (ratios per round, then
medians); no witness or recording mode is active while timing:
  native    no mode
  nothing   a do-nothing TorchDispatchMode: the floor of any Python mode
  python    EagerDecompMode("core_aten") on its Python path (EAGERDECOMP_KEY_MODE=0 at entry)
  key       EagerDecompMode("core_aten") on its C++ key (the default)
Workloads: a training step (AdamW) of the README's two models; a core op passed through
(aten.mul.Tensor, 64 elements); a decomposed op served from the cache (aten.addcmul_, 64
elements) against its kernel's core ops called directly with no mode ("floor").
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")  # cold caches: nothing from an earlier run

import torch  # noqa: E402
from results import Table, add_json_flag, save  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import eagerdecomp as ed  # noqa: E402
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step  # noqa: E402

aten = torch.ops.aten


class DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OnPython:
    """An EagerDecompMode entered on its Python path (the switch is read at entry only)."""

    def __init__(self):
        self.mode = ed.EagerDecompMode("core_aten")

    def __enter__(self):
        os.environ["EAGERDECOMP_KEY_MODE"] = "0"
        try:
            self.mode.__enter__()
        finally:
            del os.environ["EAGERDECOMP_KEY_MODE"]
        return self.mode

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def variants():
    return {"native": Null(), "nothing": DoNothing(), "python": OnPython(), "key": ed.EagerDecompMode("core_aten")}


def interleaved(fns: dict, rounds: int) -> dict:
    """``{name: [seconds per round]}``, each round running every variant once, order rotated."""
    names = list(fns)
    out = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            out[k].append(time.perf_counter() - t0)
    return out


def ratio(samples, a, b) -> float:
    return statistics.median(x / y for x, y in zip(samples[a], samples[b]))


def steps(rounds: int, table: Table) -> None:
    torch.manual_seed(0)
    models = {
        "TransformerBlock": (TransformerBlock(dim=32, dropout=0.0), TransformerBlock.batch(n=8, dim=32)),
        "SmallCNN": (SmallCNN(), SmallCNN.batch(n=4)),
    }
    for name, (model, (x, y)) in models.items():
        runs = {}
        for k, mode in variants().items():
            m = copy.deepcopy(model)
            runs[k] = (mode, m, torch.optim.AdamW(m.parameters(), lr=1e-3))
        for mode, m, opt in runs.values():  # warm-up: every kernel traced, every program installed
            for _ in range(3):
                with mode:
                    train_step(m, opt, x, y)

        def step(k):
            mode, m, opt = runs[k]

            def run():
                with mode:
                    train_step(m, opt, x, y)

            return run

        key_mode = runs["key"][0]
        misses = sum(r.misses for r in key_mode.report().rows)
        samples = interleaved({k: step(k) for k in runs}, rounds)
        misses = sum(r.misses for r in key_mode.report().rows) - misses
        ref = list(runs["native"][1].parameters())
        diff = max((a - b).abs().max().item() for a, b in zip(ref, runs["key"][1].parameters()))
        same = all(torch.equal(a, b) for a, b in zip(runs["python"][1].parameters(), runs["key"][1].parameters()))
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        table.add(
            name,
            med["native"],
            ratio(samples, "nothing", "native"),
            ratio(samples, "python", "native"),
            ratio(samples, "key", "native"),
            ratio(samples, "key", "python"),
            misses / rounds,
            diff,
            "yes" if same else "no",
        )
        print(
            f"{name:17} native {med['native']:.2f} ms | nothing {ratio(samples, 'nothing', 'native'):.2f}x | "
            f"python path {ratio(samples, 'python', 'native'):.2f}x | key {ratio(samples, 'key', 'native'):.2f}x "
            f"native | {misses / rounds:.1f} Python misses per warm key step | param diff {diff:.1e} | "
            f"key == python path bitwise: {same} | path {key_mode.path}"
        )


def per_call(fn, n: int):
    def run():
        fn(n)

    return run


def ops(rounds: int, table: Table, n: int = 64, iters: int = 2000) -> None:
    x, a, b = torch.randn(n), torch.randn(n), torch.randn(n)
    modes = variants()

    def through(mode, op):
        def batch(k):
            with mode:
                for _ in range(k):
                    op()

        return batch

    mul = lambda: aten.mul.Tensor(x, x)  # noqa: E731
    samples = interleaved({k: per_call(through(m, mul), iters) for k, m in modes.items()}, rounds)
    table.add(
        f"pass-through: aten.mul.Tensor, {n} elements",
        statistics.median(samples["native"]) / iters * 1e6,
        ratio(samples, "nothing", "native"),
        ratio(samples, "python", "native"),
        ratio(samples, "key", "native"),
        "",
    )
    print(f"pass-through mul: {table.rows[-1]}")

    y = torch.randn(n)
    addcmul = lambda: aten.addcmul_.default(y, a, b, value=0.5)  # noqa: E731
    for m in modes.values():  # trace once, install the program
        through(m, addcmul)(3)
    # the kernel's own core ops, called directly with no mode: the floor of any decomposition
    with ed.EagerDecompMode("core_aten") as probe:
        addcmul()
    into = probe.report().row(aten.addcmul_.default).into
    assert into == ["aten.add.Tensor", "aten.copy_.default", "aten.mul.Tensor"], into

    def floor():
        aten.copy_.default(y, aten.add.Tensor(y, aten.mul.Tensor(aten.mul.Tensor(a, 0.5), b)))

    fns = {k: per_call(through(m, addcmul), iters) for k, m in modes.items()}
    fns["floor"] = per_call(lambda k: [floor() for _ in range(k)], iters)
    samples = interleaved(fns, rounds)
    table.add(
        f"decomposed, cached: aten.addcmul_, {n} elements",
        statistics.median(samples["native"]) / iters * 1e6,
        ratio(samples, "nothing", "native"),
        ratio(samples, "python", "native"),
        ratio(samples, "key", "native"),
        ratio(samples, "key", "floor"),
    )
    print(f"addcmul_: {table.rows[-1]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    add_json_flag(ap)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print(f"eagerdecomp {ed.__version__}, torch {torch.__version__}, {opts.rounds} interleaved rounds, 1 thread")
    step_table = Table(
        "Training step (AdamW): the mode on its C++ key and on its Python path, per native step",
        [
            "model",
            "native ms",
            "do-nothing mode",
            "mode, Python path",
            "mode, C++ key",
            "key / Python path",
            "Python misses per step",
            "max param diff",
            "key == Python path",
        ],
        formats={
            "native ms": "{:.2f}",
            "do-nothing mode": "{:.2f}x",
            "mode, Python path": "{:.2f}x",
            "mode, C++ key": "{:.2f}x",
            "key / Python path": "{:.2f}x",
            "Python misses per step": "{:.1f}",
            "max param diff": "{:.1e}",
        },
        notes=[
            "Ratios to native, medians of per-round ratios. Python misses: calls the key handed to Python "
            "in the timed (warm) steps. max param diff: the key path's parameters against native's after "
            "every step; key == Python path: bitwise equal parameters."
        ],
    )
    op_table = Table(
        "One call at 64 elements, per native call",
        ["call", "native us", "do-nothing mode", "mode, Python path", "mode, C++ key", "key / floor"],
        formats={
            "native us": "{:.2f}",
            "do-nothing mode": "{:.2f}x",
            "mode, Python path": "{:.2f}x",
            "mode, C++ key": "{:.2f}x",
            "key / floor": "{:.2f}x",
        },
        notes=["floor: the decomposition's core ops (mul, mul, add, copy_) called directly from Python with no mode."],
    )
    steps(opts.rounds, step_table)
    ops(opts.rounds, op_table)
    save(opts.json, "keymode", [step_table, op_table], "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
