"""The CPU tier's cost per call, against PyTorch's own ``at::native::cpu_fallback``.

    python bench/fallback.py [--rounds 7] [--calls 300] [--json out.json]

On the reference device edref with ``eagerdecomp.enable("edref", on_unsupported="cpu")``, for ops
with no path to edref's kernels, side by side in one run (medians over rounds of the mean per call):

* **native CPU**: the op on CPU tensors (no copies: the floor);
* **cpu_fallback**: ``at::native::cpu_fallback`` on the same edref call, from one C++ entry
  (``eagerdecomp._C.host.cpu_fallback``): what torch_xla and MPS call;
* **tier, direct**: eagerdecomp's CPU tier on the same call from the same kind of entry
  (``eagerdecomp._C.host.run``): exact mirroring of strides and shared storage, results back;
* **tier, switch**: the user's call on edref tensors, through the dispatcher to the switch's C++
  fallback, which serves the key from its table with no Python (the route users get).

The functional overloads are timed for the direct entries (``cpu_fallback`` writes ``out=``
arguments back with ``_copy_from_and_resize``, a kernel edref lacks); the switch row is what the
user's call reaches (``torch.linalg.eigh`` on a device reaches the ``out=`` form).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("EAGERDECOMP_DISK_CACHE", "0")

import torch  # noqa: E402
from results import Table, add_json_flag, save  # noqa: E402

import eagerdecomp as ed  # noqa: E402
from eagerdecomp.runtime.library import load  # noqa: E402
from eagerdecomp.testing import reference_device  # noqa: E402

aten = torch.ops.aten


def cases(n_small: int, n_big: int):
    """(name, functional op, CPU args, user call on given args)."""
    g = torch.Generator().manual_seed(0)

    def sym(n):
        a = torch.randn(n, n, dtype=torch.float64, generator=g)
        return a + a.T

    x = torch.randn(1, 3, 16, 16, generator=g)
    grid = torch.rand(1, 8, 8, 2, generator=g) * 2 - 1
    gout = torch.randn(1, 3, 8, 8, generator=g)
    return [
        (f"eigh {n_small}x{n_small} f64", aten._linalg_eigh.default, (sym(n_small),), lambda a: torch.linalg.eigh(a)),
        (f"eigh {n_big}x{n_big} f64", aten._linalg_eigh.default, (sym(n_big),), lambda a: torch.linalg.eigh(a)),
        (
            f"svd {n_big}x{n_big} f64",
            aten._linalg_svd.default,
            (sym(n_big),),
            lambda a: torch.linalg.svd(a, full_matrices=False),
        ),
        (
            "grid_sampler_2d_backward bicubic 1x3x16x16",
            aten.grid_sampler_2d_backward.default,
            (gout, x, grid, 2, 0, False, [True, True]),
            None,
        ),
    ]


def per_call(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    add_json_flag(ap)
    opts = ap.parse_args()
    torch.set_num_threads(1)
    dev = reference_device()
    host = load().host
    switch = ed.enable(dev.type, on_unsupported="cpu")
    table = Table(
        "The CPU tier per call vs at::native::cpu_fallback (edref, 1 thread)",
        ["op", "native CPU (us)", "cpu_fallback (us)", "tier direct (us)", "tier / cpu_fallback", "switch (us)"],
        formats={
            "native CPU (us)": "{:.1f}",
            "cpu_fallback (us)": "{:.1f}",
            "tier direct (us)": "{:.1f}",
            "tier / cpu_fallback": "{:.2f}x",
            "switch (us)": "{:.1f}",
        },
    )
    for name, op, args, user in cases(8, 64):
        dargs = tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args)
        d = user and dargs[0]
        with torch.no_grad():
            if user is not None:  # agreement first: a fast wrong answer is worth nothing
                for got, want in zip(user(d), user(args[0])):
                    assert torch.equal(got.cpu(), want), name
            runs = {"native": [], "cpu_fallback": [], "tier": [], "switch": []}
            for _ in range(opts.rounds):  # interleaved, so drift hits every column alike
                runs["native"].append(per_call(lambda: op(*args), opts.calls))
                runs["cpu_fallback"].append(per_call(lambda: host.cpu_fallback(op, dargs, {}), opts.calls))
                runs["tier"].append(per_call(lambda: host.run(op, dargs, {}, dev), opts.calls))
                if user is not None:
                    runs["switch"].append(per_call(lambda: user(d), opts.calls))
        med = {k: statistics.median(v) * 1e6 if v else float("nan") for k, v in runs.items()}
        switch_us = med["switch"] if runs["switch"] else "(a backward op)"
        ratio = med["tier"] / med["cpu_fallback"]
        table.add(name, med["native"], med["cpu_fallback"], med["tier"], ratio, switch_us)
        print(f"{name:45} " + "  ".join(f"{k} {v:8.1f} us" for k, v in med.items()), flush=True)
    row = switch.report()
    table.notes.append(
        "switch: served by the C++ fallback with no Python after each key's first call "
        f"({sum(r.on_cpu for r in row.rows)} calls on the CPU tier in this run)"
    )
    save(opts.json, "fallback", [table], device="edref")


if __name__ == "__main__":
    main()
