"""Deprecated: the device switch's former module name. Use :mod:`eagerdecomp.device`."""

import sys
import warnings

from eagerdecomp import device

warnings.warn("eagerdecomp.backend is deprecated; use eagerdecomp.device", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = device
