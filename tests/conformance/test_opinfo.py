"""Conformance: every OpInfo sample, native vs ``EagerDecompMode("core_aten")`` (or the preset
``EAGERDECOMP_CONFORMANCE_OPSET`` names: ``make conformance OPSET=prims_fusion``).

See :mod:`harness` for what is compared and how samples are classified, and
:mod:`xfail` for the expected failures. A test covers one OpInfo at one dtype.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from .conftest import FAST_SAMPLES, FULL, MAX_SAMPLES, dtype_name, params
from .harness import run_sample
from .xfail import expected_for, explains

FAILING = ("unsupported", "wrong", "error")


@pytest.mark.parametrize("opinfo,dtype", params())
def test_opinfo(opinfo, dtype, results):
    name, dname = opinfo.full_name, dtype_name(dtype)
    requires_grad = dtype == torch.float64 and opinfo.supports_autograd
    limit = MAX_SAMPLES if FULL else FAST_SAMPLES
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(
            itertools.islice(
                opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad), None if limit is None else limit + 1
            )
        )
    exhaustive = limit is None or len(samples) <= limit
    samples = samples[:limit]
    entries = expected_for(name, dname)
    hit = [False] * len(entries)
    problems = []
    for i, sample in enumerate(samples):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcomes = run_sample(opinfo, sample, dtype)
        for outcome in outcomes:
            why = None
            if outcome.cls in FAILING:
                match = next((j for j, e in enumerate(entries) if explains(e, outcome)), None)
                if match is None:
                    problems.append(f"sample {i} [{outcome.variant}] {outcome.cls}: {outcome.detail}")
                else:
                    hit[match] = True
                    why = entries[match].why()
            results.add(name, dname, i, outcome, why)
    if exhaustive:
        for e, h in zip(entries, hit):
            if not h and e.strict:
                problems.append(f"unexpected pass: no sample hit the expected failure {e}")
    assert not problems, f"{name} at {dname}:\n  " + "\n  ".join(problems[:20])
