"""The harness on random ops whose stream differs from eager's: it checks eager's distribution.

Where a random op's numbers differ from eager's, :func:`harness._check_random` draws the sample
hundreds of times on each side (each call from a seed of its own, also for OpInfos that reseed
every call) and compares the distributions (:mod:`tests.distributions`). Issue 50's planted
defect (every ``normal`` decomposition drawing with the mean + 1 and the standard deviation x 2,
registered as the real ones are) passed every conformance sample when only metadata and
reproducibility were checked; here it must make them ``wrong``, and the same samples pass again
once it is undone.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.mutate import plant_normal_defect

from .conftest import _op_db
from .harness import run_sample

NORMAL_OPINFOS = ("normal", "normal.number_mean", "normal.in_place")


def _first_sample(full_name, dtype):
    opinfo = next(o for o in _op_db() if o.full_name == full_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return opinfo, next(iter(opinfo.sample_inputs("cpu", dtype)))


def _outcomes(opinfo, sample, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_sample(opinfo, sample, dtype, variants=("fn", "inplace", "out"))


@pytest.mark.parametrize("full_name", NORMAL_OPINFOS)
def test_a_planted_normal_defect_is_wrong_in_conformance(full_name):
    opinfo, sample = _first_sample(full_name, torch.float64)
    undo = plant_normal_defect()
    try:
        planted = _outcomes(opinfo, sample, torch.float64)
    finally:
        undo()
    assert planted and all(o.cls == "wrong" for o in planted), [(o.variant, o.cls, o.detail) for o in planted]
    assert all("distribution" in o.detail for o in planted), [o.detail for o in planted]
    sound = _outcomes(opinfo, sample, torch.float64)
    assert [o.cls for o in sound] == ["pass"] * len(planted), [(o.variant, o.cls, o.detail) for o in sound]


@pytest.mark.parametrize(
    "full_name,dtype",
    [
        ("bernoulli", torch.float64),
        ("geometric", torch.int64),
        ("exponential", torch.float64),
        ("multinomial", torch.float64),
    ],
)
def test_random_samples_pass_and_a_differing_stream_is_held_to_eagers_distribution(full_name, dtype):
    # (whether a stream differs is decided at run time: a decomposition may come to draw eager's numbers)
    opinfo, sample = _first_sample(full_name, dtype)
    outcomes = _outcomes(opinfo, sample, dtype)
    assert outcomes and all(o.cls == "pass" and o.random for o in outcomes), outcomes
    assert all(("eager's distribution" in o.detail) == o.stream_differs for o in outcomes), outcomes
