"""A cold process loads torch._dynamo, symbolic shapes and sympy only when it traces.

``import torch._dynamo`` costs about a second on an idle machine (several on a busy one), and
sympy most of another; a process that only passes core ops through, or whose kernels come
from the disk cache or a bundle, needs neither. Each check runs in a fresh interpreter:
this test process has long imported them all.

NOTE: a trace (exact-shape or symbolic) still loads torch._dynamo: ``FakeTensorMode()``
imports ``torch._dynamo.config`` when it is constructed, and every trace and meta-kernel
check makes one. These tests pin what does not trace.
"""

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes", "sympy")

# prints, as JSON: the heavy modules loaded after import, after a pass-through call and after a
# decomposed call, and what the mode says it did with the decomposed op
SCRIPT = r"""
import json, sys
import torch
import eagerdecomp as ed

HEAVY = HEAVY_MODULES
seen = {"import": [m for m in HEAVY if m in sys.modules]}
x = torch.randn(4, 8)
with ed.EagerDecompMode("core_aten") as mode:
    torch.mul(x, x)
    seen["pass-through"] = [m for m in HEAVY if m in sys.modules]
    y = torch.nn.functional.silu(x)
seen["decomposed"] = [m for m in HEAVY if m in sys.modules]
torch.testing.assert_close(y, torch.nn.functional.silu(x))
row = mode.report().row("aten.silu.default")
seen["route"], seen["traces"], seen["direct"] = row.route, row.traces, row.direct
print(json.dumps(seen))
"""


def _fresh(cache_dir, disk: bool, trace_after: str = "2") -> dict:
    env = dict(
        os.environ,
        EAGERDECOMP_CACHE_DIR=str(cache_dir),
        EAGERDECOMP_DISK_CACHE="1" if disk else "0",
        EAGERDECOMP_TRACE_AFTER=trace_after,
    )
    script = f"HEAVY_MODULES = {HEAVY!r}\n{SCRIPT}"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cold-imports")


def test_import_and_pass_through_load_no_tracing_machinery(cache_dir):
    seen = _fresh(cache_dir / "off", disk=False)
    assert seen["import"] == [] and seen["pass-through"] == [], seen
    assert seen["route"] == "decomposed" and seen["direct"] == 1, seen  # this process ran silu direct


def test_a_kernel_from_the_disk_cache_loads_no_tracing_machinery(cache_dir):
    first = _fresh(cache_dir / "disk", disk=True, trace_after="0")  # traces silu, writes it to the disk cache
    assert first["traces"] >= 1, first
    seen = _fresh(cache_dir / "disk", disk=True)  # a fresh process: silu's kernel from disk
    assert (seen["route"], seen["traces"]) == ("decomposed", 0), seen
    assert seen["import"] == [] and seen["pass-through"] == [] and seen["decomposed"] == [], seen
