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

from eagerdecomp import device, errors
from eagerdecomp.decompositions.registry import register_decomposition
from eagerdecomp.device import disable, enable
from eagerdecomp.dynamo import compile_backend
from eagerdecomp.errors import *  # noqa: F401,F403  (the error classes; listed in errors.__all__)
from eagerdecomp.mode import EagerDecompMode
from eagerdecomp.ops.opset import PRESETS, OpSet
from eagerdecomp.profile import profile
from eagerdecomp.runtime.cache import cache_clear, cache_info

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
    "profile",
    *errors.__all__,
]

device.enable_from_env()  # EAGERDECOMP_DEVICES=dev1,dev2[=opset]: the switch for deployments that cannot change code
