"""Indexing and tensor-creation ops models reach directly, with no path to the opset in PyTorch.

Found by replaying the aten calls of real training steps (PyTorch's benchmark operator logs).
"""

from __future__ import annotations

import torch

from .registry import project_decomposition
from .variants import resize_out

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


# NOTE: torch.ones(size, out=t) / torch.zeros(size, out=t): no functional twin of this
# signature (ones.default takes dtype=, out= gives it), so the generic out= rule cannot reach
# them. The core full in out's dtype and device, written into out resized as eager resizes it.
def _filled_out(value):
    def fill_out(size, *, out):
        result = aten.full.default(list(size), value, dtype=out.dtype, device=out.device)
        resize_out(out, result.shape)
        return aten.copy_.default(out, result)

    return fill_out


project_decomposition(aten.ones.out)(_filled_out(1))
project_decomposition(aten.zeros.out)(_filled_out(0))
