"""Micro-benchmark: the cache key builder, pure Python vs C++ (csrc/key.cpp).

For a few typical calls, microseconds per ``make_key`` of each builder, as the
runtime calls it (the C++ one through key.py's wrapper, which builds the hashed
``Key``), and of the bare C++ function (``_C.make_key``: parts only, no ``Key``).
The variants are timed interleaved, round after round; the C++/Python ratio is
taken per round and reduced by median, so machine noise hits them alike.

    python bench/key.py [--rounds 21] [--number 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from eagerdecomp.runtime import key as keymod
from eagerdecomp.runtime import library as _ext
from eagerdecomp.runtime.lift import _CLASSES

aten = torch.ops.aten


def cases():
    """(name, op, args, kwargs): calls as the dispatch mode receives them."""
    x, y, z = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)
    params = [torch.randn(16) for _ in range(10)]
    return [
        ("add.Tensor, 2 tensors", aten.add.Tensor, (x, y), {}),
        ("addcmul, float kwarg", aten.addcmul.default, (x, y, z), {"value": 0.5}),
        ("addcdiv_, lifted kwarg", aten.addcdiv_.default, (x, y, z), {"value": _CLASSES[True, False]}),
        ("cat, 10-tensor list", aten.cat.default, (params, 0), {}),
        ("sum.dim_IntList, kwargs", aten.sum.dim_IntList, (x, [0, 1], True), {"dtype": torch.float64}),
    ]


def per_call_us(build, op, args, kwargs, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        build(op, args, kwargs)
    return (time.perf_counter() - t0) / number * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--number", type=int, default=2000, help="calls per timing")
    a = p.parse_args(argv)
    if keymod.IMPLEMENTATION != "c++":
        print("C++ key builder not built (python -m eagerdecomp.info says why)", file=sys.stderr)
        return 1
    builders = {"python": keymod.make_key_py, "c++": keymod.make_key, "bare": _ext.load().make_key}
    print(f"torch {torch.__version__}, {a.rounds} rounds x {a.number} calls, medians")
    print(f"{'call':28} {'python us':>10} {'c++ us':>8} {'c++/python':>11} {'speedup':>8} {'bare c++ us':>12}")
    for name, op, args, kwargs in cases():
        # the two must agree before their speed means anything
        assert builders["python"](op, args, kwargs)[0] == builders["c++"](op, args, kwargs)[0], name
        times = {k: [] for k in builders}
        ratios = []
        for r in range(a.rounds):
            order = list(builders) if r % 2 == 0 else list(reversed(builders))
            got = {k: per_call_us(builders[k], op, args, kwargs, a.number) for k in order}
            for k, v in got.items():
                times[k].append(v)
            ratios.append(got["c++"] / got["python"])
        ratio = statistics.median(ratios)
        py, cc, bare = (statistics.median(times[k]) for k in ("python", "c++", "bare"))
        print(f"{name:28} {py:10.2f} {cc:8.2f} {ratio:11.3f} {1 / ratio:7.1f}x {bare:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
