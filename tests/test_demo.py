"""`make demo`, one of the two commands a newcomer types, runs and says what it promises, and the
numbers it prints are the ones a native run here gives (and agree with each other)."""

import json
import re
import subprocess
import sys

import torch

import eagerdecomp as ed
from eagerdecomp.demo import TransformerBlock, train_step

_NUM = r"([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


def _find(pattern: str, out: str) -> list:
    m = re.search(pattern.replace("{N}", _NUM), out)
    assert m, (pattern, out)
    return [float(g) for g in m.groups()]


def _native_losses(steps: int) -> list:
    # the demo's native side, here: the same seed, model, batch and optimizer
    torch.manual_seed(0)
    model = TransformerBlock(dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = TransformerBlock.batch()
    return [train_step(model, opt, x, y)[1].item() for _ in range(steps)]


def test_the_demo_runs_and_matches_native():
    proc = subprocess.run([sys.executable, "-m", "eagerdecomp.demo"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "only core ATen ops reached the kernels (independent recorder): True" in out, out
    assert "with dropout too: True" in out, out
    assert "kernels traced in the last step: 0 " in out, out
    # on the reference device: strict alone, and every kernel it ran its own with the switch
    assert "without eagerdecomp: NotImplementedError" in out, out
    assert "all its own: True" in out, out
    _check_numbers(out)


def _check_numbers(out: str) -> None:
    # the numbers: the first step's losses are a native run's (printed to 6 decimals), and the
    # differences it prints are float32 rounding of decomposed chains, not a wrong formula
    steps = int(_find(r"AdamW, {N} steps", out)[0])
    native = _native_losses(steps)
    loss_n, loss_o, logits, grads, params = _find(
        r"loss {N} vs {N} \| max \|diff\| logits {N}, gradients {N}, parameters after AdamW {N}", out
    )
    assert abs(loss_n - native[0]) <= 1e-6 and abs(loss_o - loss_n) <= 1e-6, (loss_n, loss_o, native[0])
    assert max(logits, grads, params) <= 1e-5, out
    last_d, last_cpu, worst, params_d = _find(
        r"{N} steps, last loss {N} vs CPU {N}; max \|diff\| logits/gradients {N}, parameters {N}", out
    )[1:]
    assert abs(last_cpu - native[-1]) <= 1e-6 and abs(last_d - last_cpu) <= 1e-6, (last_d, last_cpu, native)
    assert max(worst, params_d) <= 1e-5, out

    # the table of decomposed ops: as many rows as it says, each into core ATen ops
    (count,) = _find(r"\n{N} distinct non-core ops were decomposed", out)
    table = out.split("distinct non-core ops were decomposed")[1].split("\ncache:")[0].strip().splitlines()[1:]
    assert len(table) == count > 0, table
    core = {str(op) for op in ed.OpSet.preset("core_aten")}
    for row in table:
        op, calls, traced, arrow, *into = row.split()
        assert calls.startswith("x") and int(calls[1:]) > 0 and int(traced) >= 0 and arrow == "->", row
        assert into and all("aten." + o.rstrip(",") in core for o in into), row
    size, hits, misses, negative = _find(r"cache: {N} kernels, {N} hits, {N} misses, {N} negative", out)
    assert 0 < size <= misses and hits > 0 and negative >= 0, out
    # the timing line's ratio is its own two numbers' (no claim on how fast)
    nat, first, steady, ratio = _find(
        r"native {N} ms \| first step {N} ms \(keys run direct\) \| step \d+ [0-9.]+ ms \(hot keys traced\) \| "
        r"steady state {N} ms \({N}x",
        out,
    )
    # (each printed number is rounded: to 0.1 ms and to 0.1x, so the ratio of the printed times
    # bounds the printed ratio only within the rounding of all three)
    low, high = (steady - 0.05) / (nat + 0.05) - 0.05, (steady + 0.05) / (nat - 0.05) + 0.05
    assert min(nat, first, steady) > 0 and low - 1e-9 <= ratio <= high + 1e-9, (nat, steady, ratio)
    ran, distinct, lacking = _find(r"the device ran {N} kernels of {N} distinct ops, all its own: True; {N} ops", out)
    (with_kernels,) = _find(r"\({N} ops with kernels\)", out)
    assert 0 < distinct <= min(ran, with_kernels) and lacking > 0, out


# runs the demo's first half with time_steps watched: the modes active whenever it times steps,
# Python dispatch modes and the C++ keys of the mode and the witness (eagerdecomp.runtime.keymode)
SPEED = r"""
import json
import re
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
import eagerdecomp.demo as demo
from eagerdecomp.runtime import keymode, library

stacks, timed = [], demo.time_steps
lib = library.load()
keys = {"EagerDecompMode": keymode.key(), "KernelWitness": lib.mode.WITNESS_KEY if lib is not None else None}

def watched(*args, **kwargs):
    on = re.findall(r"\w+", str(torch._C._dispatch_tls_local_include_set()))
    stacks.append([type(m).__name__ for m in _get_current_dispatch_mode_stack()]
                  + [name for name, key in keys.items() if key is not None and key in on])
    return timed(*args, **kwargs)

demo.time_steps = watched
demo.device_main = lambda steps: None  # the device half: test_the_demo_runs_and_matches_native
demo.main(steps=5)
print(json.dumps(stacks))
"""


def test_the_demo_times_its_steps_without_the_witness():
    """A witness records every core op (RecordingMode, a second Python mode, about 2x a step):
    the timed steps run natively or under EagerDecompMode alone (its Python mode or its C++ key),
    and the witness still checks exactness."""
    proc = subprocess.run([sys.executable, "-c", SPEED], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    *out, last = proc.stdout.strip().splitlines()
    stacks = json.loads(last)
    assert [] in stacks and ["EagerDecompMode"] in stacks, stacks  # native, and the mode, were timed
    assert all(s in ([], ["EagerDecompMode"]) for s in stacks), stacks
    text = "\n".join(out)
    assert "only core ATen ops reached the kernels (independent recorder): True" in text, text
    assert "with dropout too: True" in text and "timed without the recording witness" in text, text
