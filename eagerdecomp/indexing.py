"""Indexing and tensor-creation ops models reach directly, with no path to the opset in PyTorch.

Found by replaying the aten calls of real training steps (PyTorch's benchmark operator logs).
"""

from __future__ import annotations

import torch

from .registry import project_decomposition

aten = torch.ops.aten


# NOTE: torch.tensor(...) under functionalization (and torch.compile's traced programs run
# eagerly) calls lift_fresh_copy; no decomposition in PyTorch. It is a plain copy.
@project_decomposition(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return aten.clone.default(self)


# NOTE: x[idx] = v dispatches here from the CompositeExplicitAutograd index_put_, and code
# copied from PyTorch internals calls it directly. `unsafe` only skips bounds checks in the
# native kernel; index_put (core) checks them, which is what eager does with unsafe=False.
# (Its hacked_twin overload exists for TorchScript only: the dispatcher has no entry for it.)
@project_decomposition(aten._index_put_impl_.default)
def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    return aten.index_put_.default(self, list(indices), values, accumulate)


@project_decomposition(aten._index_put_impl.default)
def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return aten.index_put.default(self, list(indices), values, accumulate)
