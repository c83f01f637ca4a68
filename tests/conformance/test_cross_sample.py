"""Conformance across samples: each OpInfo sample replayed through kernels traced on
*another* sample of the same shape family (eagerdecomp.family).

Per OpInfo and dtype, the process-wide kernel cache is emptied, then the samples run in
reverse order: a sample whose family already has a shape-generic kernel (traced on a
later sample) replays it at its own shapes, where a shape-generic bug shows. Every
outcome is classified and compared as in :mod:`test_opinfo` (same harness, same
expected failures); a ``wrong`` outcome fails the test. Proved families are audited
(``EAGERDECOMP_AUDIT_PROOFS=1``): a proof eager's meta kernel contradicts fails it too.

``EAGERDECOMP_CONFORMANCE=full`` (``make conformance``) runs every OpInfo at every
dtype on every sample; ``make test`` runs a slice: a stable ~1/8 of the OpInfos at one
dtype on their first :data:`SLICE_SAMPLES` samples. The slice picks OpInfos with at least
two samples at that dtype (one sample has nothing to cross): one with a single sample gives its
place to the next OpInfo in the hash's order that has two.
"""

from __future__ import annotations

import itertools
import os
import warnings
import zlib

import pytest

import eagerdecomp as ed

from .conftest import FULL, MAX_SAMPLES, dtype_name, params
from .harness import run_sample
from .xfail import expected_for, explains

FAILING = ("unsupported", "wrong", "error")
SLICE_SAMPLES = 4
# the slice takes the OpInfos whose name hashes to 0 modulo this (EAGERDECOMP_CROSS_EVERY=1: all of them)
SLICE_EVERY = int(os.environ.get("EAGERDECOMP_CROSS_EVERY", "16"))


def _samples(opinfo, dtype, limit) -> list:
    requires_grad = dtype == __import__("torch").float64 and opinfo.supports_autograd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad), limit))


def _cross_params() -> list:
    if FULL:
        return params()
    every = params()
    want = sum(zlib.crc32(p.values[0].full_name.encode()) % SLICE_EVERY == 0 for p in every)
    picked = []
    for p in sorted(every, key=lambda p: (zlib.crc32(p.values[0].full_name.encode()) % SLICE_EVERY, p.id)):
        if len(picked) == want:
            break
        if len(_samples(*p.values, 2)) >= 2:
            picked.append(p)
    return picked


@pytest.mark.parametrize("opinfo,dtype", _cross_params())
def test_cross_sample(opinfo, dtype, monkeypatch):
    # a family proved eager-exact is checked against eager's meta kernel here all the same:
    # a false proof is an error, not a silent pass (eagerdecomp.runtime.family)
    monkeypatch.setenv("EAGERDECOMP_AUDIT_PROOFS", "1")
    name, dname = opinfo.full_name, dtype_name(dtype)
    samples = _samples(opinfo, dtype, MAX_SAMPLES if FULL else SLICE_SAMPLES)
    if len(samples) < 2:  # (the full run only: the slice picks OpInfos with two or more)
        pytest.skip("fewer than two samples: nothing to cross")
    entries = expected_for(name, dname)
    ed.cache_clear()  # kernels for this OpInfo are traced on its own samples, below
    problems = []
    for i in reversed(range(len(samples))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcomes = run_sample(opinfo, samples[i], dtype)
        for outcome in outcomes:
            if outcome.cls in FAILING and not any(explains(e, outcome) for e in entries):
                problems.append(f"sample {i} [{outcome.variant}] {outcome.cls}: {outcome.detail}")
    info = ed.cache_info()
    assert not problems, (
        f"{name} at {dname} (samples replayed across a family {info.family_hits} times):\n  "
        + "\n  ".join(problems[:20])
    )
