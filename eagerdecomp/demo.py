"""``make demo``: a real training step under ``EagerDecompMode("core_aten")``.

Runs a small transformer block (attention, layer norm, GELU/SiLU, dropout,
cross-entropy, AdamW) natively and under the mode from identical states and
prints: do outputs, gradients and updated parameters match; which non-core ops
were decomposed and into what; cache statistics; time per step native vs first
step vs steady state. ``python -m eagerdecomp.demo``.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TransformerBlock", "SmallCNN", "train_step", "time_steps", "main", "device_main"]


class TransformerBlock(nn.Module):
    """Pre-norm transformer block with a classification head."""

    def __init__(self, dim: int = 32, heads: int = 4, classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.SiLU())
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + self.drop(a)
        x = x + self.mlp(self.ln2(x))
        return self.head(x.mean(dim=1))

    @staticmethod
    def batch(n: int = 8, seq: int = 16, dim: int = 32, classes: int = 10, device="cpu"):
        g = torch.Generator().manual_seed(1)
        return torch.randn(n, seq, dim, generator=g).to(device), torch.randint(0, classes, (n,), generator=g).to(device)


class SmallCNN(nn.Module):
    """conv-bn-relu-pool twice, then a linear head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(16 * 4, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))

    @staticmethod
    def batch(n: int = 4, classes: int = 10, device="cpu"):
        g = torch.Generator().manual_seed(2)
        return torch.randn(n, 3, 16, 16, generator=g).to(device), torch.randint(0, classes, (n,), generator=g).to(
            device
        )


def train_step(model, opt, x, y):
    """One step: forward, cross-entropy, backward, optimizer step. Returns (logits, loss, grads)."""
    opt.zero_grad(set_to_none=True)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    return logits.detach(), loss.detach(), grads


def _max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _max_param_diff(native, ours, grads) -> float:
    # Adam turns rounding noise in gradients that are zero in exact arithmetic (attention's
    # key bias) into full +-lr steps in both runs alike: compare where gradients carry signal
    diffs = []
    for p, q, g in zip(native.parameters(), ours.parameters(), grads):
        signal = g.abs() > 1e-4 * g.abs().max().clamp_min(1e-30)
        diffs.append((p - q)[signal].abs().max().item() if signal.any() else 0.0)
    return max(diffs)


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def time_steps(model, opt, x, y, steps: int) -> list:
    """Seconds of each of ``steps`` training steps, under whatever modes the caller entered.

    NOTE: the demo's timed runs enter no witness: a witness records every core op the mode
    lets through (:class:`~eagerdecomp.testing.RecordingMode`, a second Python dispatch mode,
    roughly doubles a step). The witness checks exactness separately.
    """
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
    return times


def main(steps: int = 6) -> None:
    import eagerdecomp as ed
    from eagerdecomp.device.refdev import reference_device
    from eagerdecomp.errors import BackendError
    from eagerdecomp.runtime import key
    from eagerdecomp.testing import KernelWitness, RecordingMode, witness_available

    def witness():
        # KernelWitness records below the mode's C++ key and keeps the mode on it (the path users
        # get); RecordingMode, a Python mode outside, makes it take its Python path
        return KernelWitness() if witness_available() else RecordingMode()

    try:  # before any backward pass: autograd learns the process's devices at its first one
        reference_device()
    except BackendError:
        pass  # device_main says why
    print(f"eagerdecomp {ed.__version__} | torch {torch.__version__} | key builder: {key.IMPLEMENTATION}")
    print(f"TransformerBlock (attention, layer norm, GELU/SiLU, dropout, cross-entropy), AdamW, {steps} steps\n")
    ed.cache_clear()

    # 1. exactness: dropout off, identical starting states, one step each
    torch.manual_seed(0)
    native = TransformerBlock(dropout=0.0)
    ours = copy.deepcopy(native)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    x, y = TransformerBlock.batch()
    ln, lossn, gn = train_step(native, opt_n, x, y)
    with witness() as rec, ed.EagerDecompMode("core_aten") as mode:
        lo, losso, go = train_step(ours, opt_o, x, y)
    print("matches native eager (dropout off):")
    print(
        f"  loss {lossn.item():.6f} vs {losso.item():.6f} | max |diff| logits {_max_diff([ln], [lo]):.1e}, "
        f"gradients {_max_diff(gn, go):.1e}, parameters after AdamW {_max_param_diff(native, ours, gn):.1e}"
    )
    print(f"  only core ATen ops reached the kernels (independent recorder): {not rec.outside('core_aten')}")

    # 2. speed: with dropout, native vs the first step (each key runs direct), the step that
    # traces the hot keys, and the steady state (replay), timed with no witness (time_steps says why)
    torch.manual_seed(0)
    model = TransformerBlock()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times_n = time_steps(model, opt, x, y, steps)
    hot = min(_hot(), steps - 1)  # (at least one step after it: the steady state)
    with ed.EagerDecompMode("core_aten") as mode:
        times_o = time_steps(model, opt, x, y, steps - 1)
        traced_before_last = ed.cache_info().traced
        times_o += time_steps(model, opt, x, y, 1)
    info = ed.cache_info()  # the timed run's, before the witness's step adds its hits
    # the same training with dropout, one step more, under the witness (not timed)
    with witness() as rec, ed.EagerDecompMode("core_aten"):
        train_step(model, opt, x, y)
    print(f"  with dropout too: {not rec.outside('core_aten')}")

    rep = mode.report()
    print(f"\n{len(rep.decomposed)} distinct non-core ops were decomposed (calls, kernels traced -> core ops):")
    for r in rep.decomposed:
        into = ", ".join(o.removeprefix("aten.") for o in r.into)
        print(f"  {r.op.removeprefix('aten.'):38} x{r.calls:<4} {r.traces:>3} -> {into}")
    print(f"\ncache: {info.size} kernels, {info.hits} hits, {info.misses} misses, {info.negative} negative entries")
    steady, nat = _median(times_o[hot:]), _median(times_n)
    print(
        f"time per step: native {nat * 1e3:.1f} ms | first step {times_o[0] * 1e3:.0f} ms (keys run direct) | "
        f"step {hot} {times_o[hot - 1] * 1e3:.0f} ms (hot keys traced) | steady state {steady * 1e3:.1f} ms "
        f"({steady / nat:.1f}x native; timed without the recording witness)"
    )
    print(
        f"  kernels traced in the last step: {info.traced - traced_before_last} (AdamW's step size, a float"
        " that changes every step, is a kernel input: see eagerdecomp/runtime/lift.py)"
    )
    device_main(steps)


def _hot() -> int:
    """The steps after which every key a step calls once is traced (runtime/tiers.py), the
    keys first met in the second step too (AdamW's state exists from the first step's end)."""
    from eagerdecomp.runtime.tiers import trace_after

    return trace_after() + 2


def device_main(steps: int = 6) -> None:
    """The device path: the same model on edref, a strict core-ATen-only device, with
    and without ``eagerdecomp.enable`` (no context manager in the training code)."""
    from eagerdecomp import device as device_switch
    from eagerdecomp.device.refdev import device_ops, op_log, reference_device
    from eagerdecomp.errors import BackendError

    print("\n--- a new device: edref, host memory, kernels for core ATen + runtime ops only ---")
    try:
        dev = reference_device()
    except BackendError as e:
        print(f"  skipped: {e}")
        return
    print(f"  reference_device() -> {dev} ({len(device_ops())} ops with kernels)")
    device_switch.disable(dev)
    torch.manual_seed(0)
    native = TransformerBlock(dropout=0.0)
    on_dev = copy.deepcopy(native).to(dev)
    x, y = TransformerBlock.batch()
    try:
        train_step(on_dev, torch.optim.AdamW(on_dev.parameters(), lr=1e-3), x.to(dev), y.to(dev))
        print("  without eagerdecomp: trained?! (the device should have rejected a non-core op)")
    except NotImplementedError as e:
        print(f"  without eagerdecomp: NotImplementedError: {str(e).split('. This could be')[0]}")

    # same starting state on both sides; the device's first steps run direct and trace, later ones replay
    on_dev = copy.deepcopy(native).to(dev)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-3)
    opt_d = torch.optim.AdamW(on_dev.parameters(), lr=1e-3)
    b = device_switch.enable(dev)
    times_n, times_d, worst = [], [], 0.0
    try:
        with op_log() as ran:
            for _ in range(steps):
                t0 = time.perf_counter()
                ln, lossn, gn = train_step(native, opt_n, x, y)
                t1 = time.perf_counter()
                ld, lossd, gd = train_step(on_dev, opt_d, x.to(dev), y.to(dev))
                times_n.append(t1 - t0)
                times_d.append(time.perf_counter() - t1)
                worst = max(worst, _max_diff([ln], [ld.cpu()]), _max_diff(gn, [g.cpu() for g in gd]))
    finally:
        device_switch.disable(dev)
    rep = b.report()
    print(
        f"  with ed.enable('{dev.type}'): {steps} steps, last loss {lossd.item():.6f} vs CPU {lossn.item():.6f}; "
        f"max |diff| logits/gradients {worst:.1e}, parameters {_max_param_diff(native, on_dev.cpu(), gn):.1e}"
    )
    outside = sorted(set(ran) - {n.removeprefix("aten::") for n in device_ops().names()})
    print(
        f"  the device ran {sum(ran.values())} kernels of {len(ran)} distinct ops, all its own: {not outside}; "
        f"{len(rep.decomposed)} ops it lacks were decomposed, e.g. "
        + ", ".join(r.op.removeprefix("aten.") for r in rep.decomposed[:4])
    )
    steady_d, nat = _median(times_d[min(_hot(), steps - 1) :]), _median(times_n)
    print(
        f"  time per step: CPU native {nat * 1e3:.1f} ms | edref first step {times_d[0] * 1e3:.0f} ms (keys run "
        f"direct) | steady state {steady_d * 1e3:.1f} ms ({steady_d / nat:.1f}x CPU native)"
    )


if __name__ == "__main__":
    main()
