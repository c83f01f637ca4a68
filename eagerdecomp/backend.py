"""The device switch's former module name: ``eagerdecomp.backend`` is :mod:`eagerdecomp.device`."""

import sys

from . import device

sys.modules[__name__] = device
