"""`make demo`, one of the two commands a newcomer types, runs and says what it promises."""

import json
import subprocess
import sys


def test_the_demo_runs_and_matches_native():
    proc = subprocess.run([sys.executable, "-m", "eagerdecomp.demo"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "only core ATen ops reached the kernels (independent recorder): True" in out, out
    assert "with dropout too: True" in out, out
    assert "kernels traced after the first step: 0" in out, out
    # on the reference device: strict alone, and every kernel it ran its own with the switch
    assert "without eagerdecomp: NotImplementedError" in out, out
    assert "all its own: True" in out, out


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
demo.main(steps=3)
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
