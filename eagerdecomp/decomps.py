"""eagerdecomp's own decompositions: ops PyTorch leaves without one, or decomposes wrongly.

Each entry says why it exists. They are registered at import and take
precedence over ``torch._decomp``'s tables (user registrations win over them).
"""

from __future__ import annotations

import torch

from .table import project_decomposition

aten = torch.ops.aten
