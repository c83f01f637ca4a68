"""GradScaler's two kernels in core ops: mixed-precision training on a device that has none
(and ``clip_grad_norm_``'s foreach norm, another kernel of the training step).

``torch.amp.GradScaler`` calls ``_amp_foreach_non_finite_check_and_unscale_`` on the
gradients and ``_amp_update_scale_`` on its scale every step; PyTorch has no
decomposition for either. Both follow the CPU kernels: the multiplications in the
precision they use there, the data-dependent branches as ``where``.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_REDUCED = (torch.float16, torch.bfloat16)


# NOTE: each gradient is multiplied by inv_scale in float (the kernel's opmath; a half
# gradient is not multiplied by a half-rounded scale), and found_inf becomes 1.0 where any
# element of any gradient is inf or NaN, else keeps its value.
@project_decomposition(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    bad = None
    for g in grads:
        nonfinite = aten.any.default(aten.logical_not.default(aten.isfinite.default(g)))
        bad = nonfinite if bad is None else aten.logical_or.default(bad, nonfinite)
        wide = aten._to_copy.default(g, dtype=torch.float32) if g.dtype in _REDUCED else g
        unscaled = aten.mul.Tensor(wide, inv_scale)
        aten.copy_.default(g, unscaled if unscaled.dtype == g.dtype else aten._to_copy.default(unscaled, dtype=g.dtype))
    if bad is not None:
        one = aten.full_like.default(found_inf, 1.0)
        aten.copy_.default(found_inf, aten.where.self(bad, one, found_inf))


def _times(scale, factor: float):
    # float32 * double, rounded to float32: the kernel's `float *= double`
    return aten._to_copy.default(
        aten.mul.Tensor(aten._to_copy.default(scale, dtype=torch.float64), factor), dtype=scale.dtype
    )


# NOTE: after an inf/NaN step the scale backs off and the tracker restarts; after
# growth_interval clean steps in a row the scale grows (unless that overflows) and the
# tracker restarts; otherwise the tracker counts the step.
@project_decomposition(aten._amp_update_scale_.default)
def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    found = aten.ne.Scalar(found_inf, 0)
    steps = aten.add.Tensor(growth_tracker, 1)
    grow = aten.logical_and.default(aten.logical_not.default(found), aten.eq.Scalar(steps, growth_interval))
    grown = _times(scale, growth_factor)
    grown = aten.where.self(aten.logical_and.default(grow, aten.isfinite.default(grown)), grown, scale)
    new_scale = aten.where.self(found, _times(scale, backoff_factor), grown)
    restart = aten.logical_or.default(found, grow)
    new_tracker = aten.where.self(restart, aten.zeros_like.default(growth_tracker), steps)
    aten.copy_.default(scale, new_scale)
    aten.copy_.default(growth_tracker, new_tracker)
    return scale


# NOTE: clip_grad_norm_ calls this with foreach on CUDA and PrivateUse1 devices; no
# per-tensor overload of norm has its signature, so it is mapped by hand.
@project_decomposition(aten._foreach_norm.Scalar)
def foreach_norm(self, ord=2, dtype=None):
    return [aten.linalg_vector_norm.default(t, ord, dtype=dtype) for t in self]
