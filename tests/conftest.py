"""Suite-wide settings.

NOTE: the persistent kernel cache (eagerdecomp.disk) is off for the suite, so no test
depends on what a user's ``~/.cache/eagerdecomp`` holds (nor writes to it);
tests/runtime/test_disk.py turns it on over a temporary folder of its own.
"""

import os

os.environ["EAGERDECOMP_DISK_CACHE"] = "0"


import pytest  # noqa: E402


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
