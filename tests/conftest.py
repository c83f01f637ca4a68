"""Suite-wide settings.

NOTE: the persistent kernel cache (eagerdecomp.disk) is off for the suite, so no test
depends on what a user's ``~/.cache/eagerdecomp`` holds (nor writes to it);
tests/runtime/test_disk.py turns it on over a temporary folder of its own.
"""

import os

os.environ["EAGERDECOMP_DISK_CACHE"] = "0"


import pytest  # noqa: E402
import torch  # noqa: E402

# NOTE: parametrizations `make test` leaves to `make heavy` (marked `heavy`), to keep the whole
# suite within CI's ten minutes: per test, the argument values whose cases are left out (None:
# the whole test, which a heavy target runs: make stress). Each keeps a stricter or narrower case
# in `make test` (float64 beside float32, bfloat16's rounding).
HEAVY = {
    "test_histogram": {"dtype": {torch.float32}},
    "test_the_meta_leg_answers_as_the_whole_dispatch": {"dtype": {torch.int64}},  # (float32's stays)
    "test_adaptive_max_pool3d": {"size": {(1, 1, 1)}},
    "test_avg_pool3d_backward": {"dtype": {torch.float32}},
    "test_factorizations_match_lapack": {"dtype": {torch.float32}},
    "test_ldl_bunch_kaufman": {"dtype": {torch.float32}},
    "test_sdpa_forward_backward_matches_native": {"dtype": {torch.float32, torch.float16}},
    "test_igamma_accuracy_rule": {"dtype": {torch.float32}},
    "test_bessel_accuracy_rule": {"dtype": {torch.float32}},
    "test_median_dim_ties_and_nans": {"dtype": {torch.float32}},
    "test_mode_ties_nans_and_insertion_order": {"dtype": {torch.float32}},
    "test_cache_bound_and_flat_memory_over_many_shapes": None,  # thousands of shapes: make stress
    # the samplers' rejection loops at large rates (smaller rates of the same branches stay)
    "test_poisson_distribution": {"lam": {37.5, 1000.0}},
    "test_binomial_distribution": {"count": {100}},
    # Inductor compiles per op and dtype (seconds each): float64, the stricter comparison, stays
    "test_compiled": {"dtype": {torch.float32}},
    # two fresh processes each: the warn_always case stays, which also covers the once-per-process rule
    "test_scatter_reduce_deprecation_from_a_disk_cache_kernel_is_eagers": {"always": {False}},
    "test_index_reduce_is_bitwise_eager": {"dtype": {torch.float16}},  # (bfloat16's rounding stays)
    "test_adaptive_max_pool2d": {"dtype": {torch.float32}, "size": {(7, 9), (6, 8)}},
    "test_distance_backwards": {"p": {1.5, 3.0}},
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name not in HEAVY:
            continue
        left_out, params = HEAVY[name], getattr(getattr(item, "callspec", None), "params", {})
        if left_out is None or any(params.get(arg) in values for arg, values in left_out.items() if arg in params):
            item.add_marker(pytest.mark.heavy)


def pytest_configure(config):
    # NOTE: the autograd engine knows only the devices present at a process's first backward
    # pass (eagerdecomp.refdev), so the reference device is registered before any test runs:
    # a test that uses it then passes whichever tests ran before it
    from eagerdecomp.device.refdev import reference_device
    from eagerdecomp.errors import BackendError

    try:
        reference_device()
    except BackendError:  # no C++ library (EAGERDECOMP_NO_EXT=1): those tests skip
        pass


@pytest.fixture
def trace_first(monkeypatch):
    """Every key traced at its first call (``EAGERDECOMP_TRACE_AFTER=0``), as before tiers.

    For tests of what a traced kernel does (replays, shape families, lifted floats, the C++
    hit path, the disk cache, counters): they call a key once or twice, which under the
    default tiers would run direct (eagerdecomp.runtime.tiers; tests/runtime/test_tiers.py
    checks the two tiers agree bitwise)."""
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "0")


@pytest.fixture
def switched_device():
    """The reference device (edref) with the switch on for the test, off after it; skipped
    where the C++ library is not built (EAGERDECOMP_NO_EXT=1)."""
    import eagerdecomp as ed
    from eagerdecomp.testing import reference_device

    try:
        dev = reference_device()
    except ed.errors.BackendError as e:
        pytest.skip(str(e))
    ed.enable(dev)
    try:
        yield dev
    finally:
        ed.disable(dev)
