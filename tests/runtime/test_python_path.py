"""Parity: the runtime's tests on the pure-Python path (EAGERDECOMP_NO_EXT=1: no C++ key, no
C++ hit path), in a fresh process. `make parity` runs every runtime test file this way; this is
its slice for `make test` (the C++ path runs them in this process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eagerdecomp.runtime import hits

SLICE = ["tests/test_mode.py", "tests/runtime/test_cache.py", "tests/runtime/test_routes.py"]


@pytest.mark.skipif(not hits.enabled(), reason="already on the pure-Python path")
def test_runtime_tests_pass_on_the_pure_python_path():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    env = {**os.environ, "EAGERDECOMP_NO_EXT": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SLICE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
