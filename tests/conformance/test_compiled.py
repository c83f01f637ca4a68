"""Conformance under ``compile="inductor"``: a representative slice of OpInfos, each sample
answered by its compiled kernel and compared with eager like any other (``make
conformance-compiled`` runs every OpInfo, capped in samples).

The slice: ops whose decompositions are chains of pointwise ops (what fusion changes),
reductions and losses over them, backward ops, and in-place and out= forms (compiled
with their input writes kept).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from .conftest import _op_db
from .harness import compiled, run_sample

# tests of what a traced kernel does: every key traced at its first call (conftest.trace_first)
pytestmark = pytest.mark.usefixtures("trace_first")

SLICE = (
    "logaddexp",
    "lerp",
    "addcmul",
    "nn.functional.huber_loss",
    "nn.functional.softplus",
    "nn.functional.hardswish",
    "nn.functional.elu",
    "nn.functional.mse_loss",
    "nn.functional.glu",
    "nn.functional.silu",
    "xlogy",
    "hypot",
    "nn.functional.smooth_l1_loss",
    "addcdiv",
)
DTYPES = (torch.float32, torch.float64)


def _params():
    by_name = {o.full_name: o for o in _op_db()}
    return [pytest.param(by_name[n], d, id=f"{n}-{str(d).removeprefix('torch.')}") for n in SLICE for d in DTYPES]


@pytest.mark.parametrize("opinfo,dtype", _params())
def test_compiled(opinfo, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=dtype == torch.float64), 2))
    outcomes = []
    with compiled("inductor"):
        for sample in samples:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outcomes += run_sample(opinfo, sample, dtype)
    bad = [f"[{o.variant}] {o.cls}: {o.detail}" for o in outcomes if o.cls not in ("pass", "pass-native")]
    assert not bad, "\n".join(bad)
    # the slice must exercise the compiled path, or it checks nothing new
    assert any("compiled" in o.notes for o in outcomes), [(o.variant, o.cls, o.notes) for o in outcomes]
