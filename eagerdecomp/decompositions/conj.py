"""Physical conjugation (``conj_physical``, ``resolve_conj``, ``copy_`` of a conjugate view).

NOTE: PyTorch lowers ``conj_physical`` to ``prims.conj_physical``, whose aten
implementation is ``_conj_physical``, which has no decomposition. A complex tensor viewed
as (real, imag) pairs (``view_as_real``, which a device with complex dtypes provides:
docs/device-guide.md) times (1, -1), viewed back as complex, is its conjugate: exact, with
eager's layout (the product keeps the input's order, as eager's kernel does). Where
``view_as_real`` is not an opset op (``core_aten`` under the mode) this has no path either.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


@project_decomposition(aten._conj_physical.default)
def conj_physical(self):
    if not self.is_complex():
        return aten.clone.default(self)
    pairs = aten.view_as_real.default(self)
    signs = aten.scalar_tensor.default(-1.0, dtype=pairs.dtype, device=pairs.device)
    signs = aten.cat.default(
        [aten.full.default([1], 1.0, dtype=pairs.dtype, device=pairs.device), aten.view.default(signs, [1])]
    )
    return aten.view_as_complex.default(aten.mul.Tensor(pairs, signs))
