"""The C++ hit table keeps the keys in use when new ones keep coming (csrc/hit.cpp's two
generations): a bounded table must not drop a hot key just because it filled up."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from eagerdecomp.runtime import hits

pytestmark = [
    pytest.mark.skipif(not hits.enabled(), reason="the C++ hit path is not built"),
    pytest.mark.usefixtures("trace_first"),
]  # tests of traced kernels (conftest.trace_first)

SCRIPT = textwrap.dedent(
    """
    import json, torch, eagerdecomp as ed
    hot = torch.randn(5, 3)
    with ed.EagerDecompMode("core_aten") as mode:
        for n in range(8, 8 + 60):  # 60 new keys of silu against a table of 16
            torch.nn.functional.silu(torch.randn(n))
            torch.nn.functional.hardswish(hot)  # the hot key, between every two new ones
    row = mode.report().row(torch.ops.aten.hardswish.default)
    print(json.dumps({"calls": row.calls, "cpp": row.cpp_hits, "size": len(mode.runtime.hits)}))
    """
)


def test_a_hot_key_stays_in_cpp_while_new_keys_fill_the_table():
    env = dict(os.environ, EAGERDECOMP_CACHE_SIZE="16", EAGERDECOMP_DISK_CACHE="0")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # every call after the first (which installs the program) is a C++ hit; clearing the whole
    # table when full, as before, sent the hot key back to Python after each fill
    assert got["calls"] == 60 and got["cpp"] == 59, got
    assert got["size"] <= 16
