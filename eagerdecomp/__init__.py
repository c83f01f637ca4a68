"""eagerdecomp: run the whole ATen surface in eager mode on a backend that
implements only Core ATen (or Prims).

Ops outside the target opset are decomposed with PyTorch's own decomposition
library, traced once into an FX kernel per key, cached, and replayed.

Example::

    >>> import torch, eagerdecomp as ed
    >>> with ed.EagerDecompMode("core_aten") as mode:
    ...     y = torch.nn.functional.gelu(torch.randn(8)).sum()
    >>> print(mode.report())  # doctest: +SKIP
"""

from . import device
from . import device as backend  # the module's former name, kept importable
from .device import disable, enable
from .cache import cache_clear, cache_info
from .compile import compile_backend
from . import errors
from .errors import *  # noqa: F401,F403  (the error classes; listed in errors.__all__)
from .mode import EagerDecompMode
from .opset import PRESETS, OpSet
from .profile import profile
from .registry import register_decomposition

__version__ = "0.1.0"

__all__ = [
    "EagerDecompMode",
    "OpSet",
    "PRESETS",
    "register_decomposition",
    "cache_info",
    "cache_clear",
    "compile_backend",
    "enable",
    "disable",
    "device",
    "backend",
    "profile",
    *errors.__all__,
]

device.enable_from_env()  # EAGERDECOMP_BACKENDS=dev1,dev2[=opset]: the switch for deployments that cannot change code
