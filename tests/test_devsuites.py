"""A fixed slice of PyTorch's own device suites on edref, and one on edprims (``make devsuites``
and ``make devsuites DEVICE=edprims`` run them all).

The slice (tests/devsuites/slice.txt; slice-edprims.txt for edprims) holds the tests behind
each defect the device suites found, and known failures of each kind; the runner compares the
device with CPU and fails on anything tests/devsuites/known.py does not expect, or on a changed
dispatch state.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.devsuites import run
from tests.devsuites.ids import generic_id

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not all((run.SOURCE / f).is_file() for f in run.FILES), reason=f"PyTorch's test files are not at {run.SOURCE}"
)


def _run_slice(tmp_path, slice_file: str, *args) -> dict:
    """The runner over ``slice_file``'s tests: its summary, checked (every test of the slice a CPU
    pass, each a pass or a known failure on the device, no state changed)."""
    out = tmp_path / "summary"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.devsuites", "--select", str(ROOT / slice_file), "--jobs", "1", "--out", str(out)]
        + list(args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    wanted = [line for line in (ROOT / slice_file).read_text().splitlines() if line and not line.startswith("#")]
    assert summary["cpu_passed"] == len(wanted)  # every test of the slice is a CPU pass
    assert summary["device_passed"] + summary["known_failures"] == len(wanted)
    assert not summary["state_changed"] and not summary["unexpected"]
    return summary


def test_the_slice_runs_on_edref_as_expected(tmp_path):
    assert _run_slice(tmp_path, "tests/devsuites/slice.txt")["known_failures"] >= 3


def test_a_slice_runs_on_edprims_as_expected(tmp_path):
    # the prims reference device (make devsuites DEVICE=edprims runs every test)
    summary = _run_slice(
        tmp_path, "tests/devsuites/slice-edprims.txt", "--device", "edprims", "--files", "test_view_ops.py"
    )
    assert summary["device"] == "edprims" and summary["known_failures"] == 1 and summary["device_passed"] == 6


def test_ids_name_a_test_on_every_device():
    # one generic id for the CPU and the device copy of a test, parametrized names included
    assert (
        generic_id("test_nn.py", "TestNNDeviceTypeCPU", "test_x_cpu_float32", "cpu")
        == "test_nn.py::TestNNDeviceType::test_x_DEVICE_float32"
    )
    assert (
        generic_id("test_nn.py", "TestNNDeviceTypeEDREF", "test_x_edref_float32", "edref")
        == "test_nn.py::TestNNDeviceType::test_x_DEVICE_float32"
    )
    assert (
        generic_id("a.py", "TestViewOpsPRIVATEUSE1", "test_from_cpu_edref", "edref")
        == "a.py::TestViewOps::test_from_cpu_DEVICE"
    )
    assert (
        generic_id("a.py", "TestViewOpsCPU", "test_from_cpu_cpu_int32", "cpu")
        == "a.py::TestViewOps::test_from_cpu_DEVICE_int32"
    )
