"""`make demo`, one of the two commands a newcomer types, runs and says what it promises."""

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
