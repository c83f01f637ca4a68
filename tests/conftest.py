"""Suite-wide settings.

NOTE: the persistent kernel cache (eagerdecomp.disk) is off for the suite, so no test
depends on what a user's ``~/.cache/eagerdecomp`` holds (nor writes to it);
tests/test_disk.py turns it on over a temporary folder of its own.
"""

import os

os.environ["EAGERDECOMP_DISK_CACHE"] = "0"
