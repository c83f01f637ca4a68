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

from . import harness
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


def test_a_sample_that_ignores_its_draws_is_judged_by_value():
    # SDPA is tagged random (dropout) but draws nothing at dropout_p=0. Its float32 samples differ
    # from the CPU flash kernel by tiled rounding (1.4e-5 on one), which the distribution test read
    # as a shifted distribution (|T| 10, every call sharing the one difference): "wrong" under the
    # preset's traced run. Judged by value at the OpInfo's declared tolerance, they pass.
    opinfo = next(o for o in _op_db() if o.full_name == "nn.functional.scaled_dot_product_attention")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = [s for s in opinfo.sample_inputs("cpu", torch.float32) if not s.kwargs.get("dropout_p")]
    assert len(samples) > 10
    fn = [_outcomes(opinfo, s, torch.float32)[0] for s in samples]
    assert all(o.cls == "pass" and not o.stream_differs for o in fn), [(o.cls, o.detail) for o in fn if o.cls != "pass"]
    assert harness.declared_tolerance(opinfo)[torch.float32] == (5e-6, 5e-5)
    assert harness.declared_tolerance(next(o for o in _op_db() if o.name == "matmul")) == {}


@pytest.mark.parametrize("p,ignored", [(0.5, False), (1.0, True), (0.0, True)])
def test_ignored_draws_need_every_call_to_repeat(p, ignored):
    # a scalar bernoulli at 0.5 repeats itself on two calls half the time: the judgement takes 100
    args = (torch.tensor(p, dtype=torch.float64), (), {})
    assert harness._ignores_draws(torch.bernoulli, args) is ignored
