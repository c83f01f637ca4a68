"""Backwards of the margin losses (multi_margin_loss, multilabel_margin_loss) in core ops.

NOTE: no decomposition in PyTorch. Each is its CPU kernel's gradient rule vectorized over
the samples and classes: a class whose hinge term is positive gets +h, the target class
-h for each such term, scaled by 1/C (and 1/N for mean) and by grad_output (per sample for
reduction='none'). Sums over classes run in another order than the kernel's loop: results
agree to rounding.
"""

from __future__ import annotations

import torch
import torch._decomp

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_NONE, _MEAN = 0, 1


def _as_2d(self, target):
    """(N, C) input and (N, ...) target: a 1-D or 0-D input is one sample."""
    if self.dim() <= 1:
        c = self.numel() if self.dim() == 1 else 1
        return aten.reshape.default(self, [1, c]), aten.reshape.default(target, [1, -1])
    return self, target


def _scale(reduction, n, c) -> float:
    # an empty input has an empty gradient: no scale to compute (1 / 0)
    if n * c == 0:
        return 0.0
    return 1.0 / (n * c) if reduction == _MEAN else 1.0 / c


def _scale_by_grad(grad, grad_output, reduction, n):
    if reduction == _NONE and grad_output.dim() > 0:
        return aten.mul.Tensor(grad, aten.reshape.default(grad_output, [n, 1]))
    return aten.mul.Tensor(grad, aten.reshape.default(grad_output, []))


# loss_n = sum_{i != y} w[y] max(0, margin - x[y] + x[i])^p / C
@project_decomposition(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=_MEAN):
    if p not in (1, 2) or not self.dtype.is_floating_point:
        return NotImplemented
    x, _ = _as_2d(self, target)
    n, c = x.shape
    y = aten.reshape.default(target, [n, 1])
    g = _scale(reduction, n, c)
    x_y = aten.gather.default(x, 1, y)
    z = aten.add.Tensor(aten.sub.Tensor(x, x_y), margin)
    classes = aten.unsqueeze.default(aten.arange.default(c, device=x.device), 0)
    is_target = aten.eq.Tensor(classes, y)
    active = aten.logical_and.default(aten.gt.Scalar(z, 0), aten.logical_not.default(is_target))
    h = aten.full_like.default(z, g) if p == 1 else aten.mul.Tensor(z, 2 * g)
    if weight is not None:
        h = aten.mul.Tensor(h, aten.index_select.default(weight, 0, aten.reshape.default(target, [-1])).reshape([n, 1]))
    h = aten.where.self(active, h, aten.zeros_like.default(h))
    total = aten.sum.dim_IntList(h, [1], True)
    grad = aten.where.self(is_target, aten.neg.default(aten.expand.default(total, [n, c])), h)
    grad = _scale_by_grad(grad, grad_output, reduction, n)
    return aten.clone.default(aten.reshape.default(grad, list(self.shape)), memory_format=torch.contiguous_format)


# loss_n = sum_{targets j} sum_{non-targets i} max(0, 1 - (x[y_j] - x[i])) / C; the targets are
# target[n, :] up to the first -1, is_target marks them per class (saved by the forward).
@project_decomposition(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    if not self.dtype.is_floating_point:
        return NotImplemented
    x, t = _as_2d(self, target)
    n, c = x.shape
    marks = aten.reshape.default(is_target, [n, c])
    g = _scale(reduction, n, c)
    ended = aten.cumsum.default(aten._to_copy.default(aten.eq.Scalar(t, -1), dtype=torch.int64), 1)
    valid = aten.eq.Scalar(ended, 0)  # [n, c]: targets before the first -1
    y = aten.where.self(valid, t, aten.zeros_like.default(t))
    x_y = aten.gather.default(x, 1, y)  # [n, c]
    z = aten.add.Tensor(aten.sub.Tensor(aten.unsqueeze.default(x, 1), aten.unsqueeze.default(x_y, 2)), 1.0)  # [n, j, i]
    active = aten.logical_and.default(aten.gt.Scalar(z, 0), aten.unsqueeze.default(aten.eq.Scalar(marks, 0), 1))
    active = aten.logical_and.default(active, aten.unsqueeze.default(valid, 2))
    counts = aten._to_copy.default(active, dtype=x.dtype)
    plus = aten.sum.dim_IntList(counts, [1])  # per class i: its active terms
    minus = aten.sum.dim_IntList(counts, [2])  # per target j
    grad = aten.scatter_add.default(plus, 1, y, aten.neg.default(minus))
    grad = aten.mul.Tensor(grad, g)
    grad = _scale_by_grad(grad, grad_output, reduction, n)
    return aten.clone.default(aten.reshape.default(grad, list(self.shape)), memory_format=torch.contiguous_format)


# NOTE: a 1-d input with a 0-dim target and reduction='none': the CPU kernel returns a 0-dim loss,
# the meta kernel and PyTorch's decomposition a [1] one (a wrong shape that matches the meta
# kernel, so no check would catch it); declined. Every other call is PyTorch's decomposition.
_TORCH_MULTI_MARGIN = torch._decomp.decomposition_table[aten.multi_margin_loss.default]


@project_decomposition(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    if self.dim() <= 1 and target.dim() == 0 and reduction == _NONE:
        return NotImplemented
    return _TORCH_MULTI_MARGIN(self, target, p, margin, weight, reduction)


# NOTE: PyTorch's decomposition of the forward sums the hinge terms of every target slot,
# those after the first -1 included (gathered at class 0): a wrong loss for any target with
# a -1 before its last slot. Here the slots past the first -1 are masked, as the kernel stops
# reading there; a class named twice counts twice, as in the kernel's loop.
@project_decomposition(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    if not self.dtype.is_floating_point or self.dim() > 2 or self.shape != target.shape:
        return NotImplemented
    # NOTE: a 1-d input with reduction='none': the CPU kernel returns a 0-dim loss, its meta kernel
    # a [1] one, and a trace is checked against the meta kernel; declined (a clear error) rather
    # than answered with the meta kernel's shape.
    if self.dim() == 1 and reduction == _NONE:
        return NotImplemented
    x, t = _as_2d(self, target)
    n, c = x.shape
    ended = aten.cumsum.default(aten._to_copy.default(aten.eq.Scalar(t, -1), dtype=torch.int64), 1)
    valid = aten.eq.Scalar(ended, 0)
    y = aten.where.self(valid, t, aten.zeros_like.default(t))
    marks = aten.scatter_reduce.two(
        aten.zeros_like.default(x, dtype=torch.int64),
        1,
        y,
        aten._to_copy.default(valid, dtype=torch.int64),
        "amax",
        include_self=True,
    )
    x_y = aten.gather.default(x, 1, y)
    z = aten.add.Tensor(aten.sub.Tensor(aten.unsqueeze.default(x, 1), aten.unsqueeze.default(x_y, 2)), 1.0)  # [n, j, i]
    keep = aten.logical_and.default(
        aten.unsqueeze.default(valid, 2), aten.unsqueeze.default(aten.eq.Scalar(marks, 0), 1)
    )
    z = aten.where.self(keep, aten.clamp.default(z, 0), aten.zeros_like.default(z))
    loss = aten.div.Tensor(aten.sum.dim_IntList(z, [1, 2]), c)
    if reduction == _MEAN:
        loss = aten.mean.default(loss)
    elif reduction != _NONE:
        loss = aten.sum.default(loss)
    return loss, aten.reshape.default(aten._to_copy.default(marks, dtype=self.dtype), list(target.shape))
