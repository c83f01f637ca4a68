"""Training-loop idioms (tests/idioms.py) under the mode and on edref with the switch, each
against the same code run natively (issue 49).

Every idiom runs three times from the same seed: natively on CPU, under
``EagerDecompMode("core_aten")`` with a :class:`RecordingMode` outside it (the witness that only
core ops reached the kernels), and on the reference device with the switch on. The results must
agree on structure, dtypes, shapes, significant strides (the conformance harness's
``compare_outputs``), values to rounding, and the text and flags the idiom returns; where eager
raises, the same exception type.

An idiom with ``process=True`` (DataLoader workers) runs natively, under the
mode and on edref in one fresh process, whose answer both of its tests read.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode
from tests.conformance.harness import compare_outputs
from tests.idioms import IDIOMS

ROOT = Path(__file__).resolve().parent.parent
SEED = 0
WHERE = ("mode", "edref")
_SKIP = "skipped:"  # a fresh process's answer for a run it could not make


class Raised:
    """An idiom that raised: compared by the exception's type."""

    def __init__(self, e: BaseException):
        self.type, self.text = type(e), f"{type(e).__name__}: {e}"

    def __repr__(self):
        return self.text


def _plain(tree):
    """CPU tensors (strides kept), numpy arrays as tensors, detached: what is compared."""

    def leaf(x):
        if isinstance(x, np.ndarray):
            return torch.from_numpy(x.copy())
        if isinstance(x, torch.Tensor) and x.device.type != "cpu" and x.layout == torch.strided:
            # the same view of a host copy of its storage: strides and offset as on the device
            host = torch.empty(0, dtype=x.dtype)
            return host.set_(x.untyped_storage().cpu(), x.storage_offset(), x.shape, x.stride())
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu")
        if isinstance(x, torch.dtype | torch.device):
            return str(x)
        return x

    return tree_map(leaf, tree)


def run(name: str, where: str, dev=None):
    """The idiom's result natively (``where="native"``), under the mode or on ``dev`` (switched on
    by the caller), or :class:`Raised`."""
    fn = IDIOMS[name].fn
    torch.manual_seed(SEED)
    if where == "mode":
        with RecordingMode() as rec:
            try:
                with ed.EagerDecompMode("core_aten"):
                    out = fn(torch.device("cpu"))
            except Exception as e:  # noqa: BLE001 - compared with what eager does
                return Raised(e)
        rec.assert_only("core_aten")
        return _plain(out)
    try:
        return _plain(fn(dev if where == "edref" else torch.device("cpu")))
    except Exception as e:  # noqa: BLE001 - compared with what eager does
        return Raised(e)


@functools.cache
def native(name: str):
    return run(name, "native")


def assert_like_native(name: str, got, want) -> None:
    if isinstance(want, Raised) or isinstance(got, Raised):
        outcome = lambda r: repr(r) if isinstance(r, Raised) else "a result"
        assert isinstance(want, Raised) and isinstance(got, Raised) and got.type is want.type, (
            f"{name}: eager gave {outcome(want)}, the run gave {outcome(got)}"
        )
        return
    compare_outputs(want, got, (), (), values=False)  # structure, dtypes, shapes, strides
    tol = IDIOMS[name].tol
    numbers = lambda tree: [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor | float)]
    others = lambda tree: [x for x in tree_flatten(tree)[0] if not isinstance(x, torch.Tensor | float)]
    kw = {} if tol is None else {"rtol": tol[0], "atol": tol[1]}
    torch.testing.assert_close(numbers(got), numbers(want), equal_nan=True, check_stride=False, **kw)
    assert others(got) == others(want), f"{name}: text, flags and exceptions differ from eager's"


def _params():
    for name, idiom in IDIOMS.items():
        for where in WHERE:
            marks = []
            if idiom.process:  # both runs from one process: on one xdist worker under --dist loadgroup
                marks.append(pytest.mark.xdist_group(f"idioms-{name}"))
            yield pytest.param(name, where, marks=marks, id=f"{name}-{where}")


@pytest.mark.parametrize(("name", "where"), list(_params()))
def test_idiom_behaves_as_eager(name, where, request):
    if IDIOMS[name].process:
        failure = _in_fresh_process(name)[where]
        if failure is not None and failure.startswith(_SKIP):
            pytest.skip(failure)
        assert failure is None, failure
        return
    dev = request.getfixturevalue("switched_device") if where == "edref" else None
    limit = IDIOMS[name].limit.get(where)
    if limit is not None:  # a limit docs/limits.md names: eager runs, this run raises its clear error
        got, want = run(name, where, dev), native(name)
        assert not isinstance(want, Raised), want
        assert isinstance(got, Raised) and issubclass(got.type, limit), f"{name}: expected {limit.__name__}, got {got}"
        return
    assert_like_native(name, run(name, where, dev), native(name))


@functools.cache
def _in_fresh_process(name: str) -> dict:
    # NOTE: DataLoader workers fork the process, the mode with it: a fresh process has no
    # threads but its own at the fork (pytest's have their locks)
    script = f"from tests.test_idioms import check_all; check_all({name!r})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_all(name: str) -> None:
    """The entry point of a fresh process: the idiom natively, under the mode and on edref;
    prints ``{where: None or why it differs}`` as its last line."""
    from eagerdecomp.testing import reference_device

    failures = {}
    try:
        dev = reference_device()  # before any backward: the engine knows the devices it starts with
    except ed.BackendError as e:  # no C++ library (EAGERDECOMP_NO_EXT=1): as the fixture, skipped
        dev, failures["edref"] = None, f"{_SKIP} {e}"
    want = run(name, "native")
    for where in WHERE:
        if where in failures:
            continue
        if where == "edref":
            ed.enable(dev)
        try:
            assert_like_native(name, run(name, where, dev), want)
            failures[where] = None
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            failures[where] = traceback.format_exc()[-4000:]
        finally:
            if where == "edref":
                ed.disable(dev)
    print(json.dumps(failures))
