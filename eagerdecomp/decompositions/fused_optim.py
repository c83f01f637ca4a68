"""Fused optimizer steps (``torch.optim.SGD/Adam/AdamW(fused=True)``) in pointwise ops.

NOTE: ``_fused_sgd_``, ``_fused_adam_`` and ``_fused_adamw_`` have CPU/CUDA kernels only and no
decomposition in PyTorch, yet each is arithmetic on lists of tensors. The steps follow ATen's CPU
kernels (aten/src/ATen/native/cpu/FusedAdamKernel.cpp, FusedSGDKernel.cpp) in their order of
operations, so results agree with the CPU's to rounding (the kernels' vector loops fuse some
multiply-adds that pointwise ops round twice):

- the arithmetic runs in the parameter's dtype, in float32 for float16/bfloat16 (ATen's opmath),
  with each stored tensor rounded to its dtype once;
- the constants the kernel computes in double (the bias corrections from ``state_steps``, the
  step size, AdamW's ``1 - lr * weight_decay``) are computed in float64 tensors, so a tensor ``lr``
  and the step counts stay tensors: no ``.item()``, and the decomposition traces once;
- ``found_inf == 1`` makes the kernel return before writing anything: here each write keeps the old
  value where ``found_inf`` is 1 (``where``), so no call depends on the flag's value;
- ``grad_scale`` divides the gradients, which are written back unscaled (the kernel does so);
- fused SGD of float16/bfloat16 parameters is refused (see the NOTE in :func:`fused_sgd_`).

The functional forms (``_fused_adam`` ..., which functionalization and ``torch.compile`` produce)
run the in-place step on clones of the lists it writes, as their generated kernels do.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.ops.checks import scalar_type_name

aten = torch.ops.aten

_KERNEL_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # AT_DISPATCH_FLOATING_TYPES_AND2


def _opmath(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _as(x, dtype, device=None):
    if x.dtype == dtype and (device is None or x.device == device):
        return x
    return aten._to_copy.default(x, dtype=dtype, device=device)


def _checks(kernel: str, params, lists: dict) -> None:
    """ATen's checks, with its messages: list lengths, then the dtypes its kernel dispatches."""
    for name, tensors in lists.items():
        if len(tensors) != len(params):
            raise RuntimeError(
                f"Expected {name}.size() == n_tensors to be true, but got false.  (Could this error message "
                "be improved?  If so, please report an enhancement request to PyTorch.)"
            )
    for p in params:
        if p.dtype not in _KERNEL_DTYPES:
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(p.dtype)}'")


def _skip_flag(found_inf):
    return None if found_inf is None else aten.eq.Scalar(found_inf, 1.0)


def _store(dest, value, skip) -> None:
    """One write of ``dest``: ``value`` rounded to its dtype, or its old value when the step is skipped."""
    value = _as(value, dest.dtype)
    if skip is not None:
        value = aten.where.self(skip, dest, value)
    aten.copy_.default(dest, value)


def _f64(value, device):
    """A float or a tensor (``lr``, a step count) as a float64 0-d tensor: the kernels' double."""
    if isinstance(value, torch.Tensor):
        return _as(value, torch.float64, device)
    return aten.scalar_tensor.default(value, dtype=torch.float64, device=device)


def _in_memory_order(*tensors):
    """The tensors of one step as the kernel sees them: ``numel`` elements from each one's data
    pointer, paired by memory position (it never reads strides). Contiguous tensors as they are.

    NOTE: optimizer states are made ``zeros_like`` their parameter, so layouts match and this is
    the identity; a transposed parameter with contiguous states is stepped element by memory
    position in eager, and here too (flat views, written in place)."""
    if all(t is None or t.is_contiguous() for t in tensors):
        return tensors
    return tuple(t if t is None else aten.as_strided.default(t, [t.numel()], [1], t.storage_offset()) for t in tensors)


def _one_minus(x):
    return aten.add.Tensor(aten.neg.default(x), 1.0)  # exactly 1 - x


def _unscaled_grad(grad, op_dtype, grad_scale, skip):
    g = _as(grad, op_dtype)
    if grad_scale is not None:
        g = aten.div.Tensor(g, _as(grad_scale, op_dtype))
        _store(grad, g, skip)
    return g


def _adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, c, skip, adamw: bool) -> None:
    beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale = c
    op = _opmath(param.dtype)
    step64 = _as(step, torch.float64)  # (the kernel reads the step as a float, then a double)
    lr64 = _f64(lr, param.device)
    bias_correction1 = _one_minus(aten.pow.Scalar(beta1, step64))
    bias_correction2_sqrt = aten.sqrt.default(_one_minus(aten.pow.Scalar(beta2, step64)))
    neg_step_size = _as(aten.neg.default(aten.div.Tensor(lr64, bias_correction1)), op)

    p = _as(param, op)
    g = _unscaled_grad(grad, op, grad_scale, skip)
    if maximize:
        g = aten.neg.default(g)
    if weight_decay != 0:
        if adamw:
            p = aten.mul.Tensor(p, _as(_one_minus(aten.mul.Tensor(lr64, weight_decay)), op))
        else:
            g = aten.add.Tensor(g, aten.mul.Tensor(p, weight_decay))
    m = aten.lerp.Scalar(_as(exp_avg, op), g, 1 - beta1)
    v = aten.add.Tensor(aten.mul.Tensor(_as(exp_avg_sq, op), beta2), aten.mul.Tensor(aten.mul.Tensor(g, 1 - beta2), g))
    _store(exp_avg, m, skip)
    _store(exp_avg_sq, v, skip)
    if amsgrad:
        v = aten.maximum.default(_as(max_exp_avg_sq, op), v)
        _store(max_exp_avg_sq, v, skip)
    denom = aten.add.Tensor(aten.div.Tensor(aten.sqrt.default(v), _as(bias_correction2_sqrt, op)), eps)
    _store(param, aten.add.Tensor(p, aten.div.Tensor(aten.mul.Tensor(neg_step_size, m), denom)), skip)


def _off_the_cpu(params) -> bool:
    # NOTE: ATen's fused kernels write through raw pointers and bump no version counter. Under the
    # mode (below autograd) this decomposition's copy_ bumps none either; on a device with the
    # switch it is called above ADInplaceOrView (the fused ops have no autograd kernel), so every
    # written tensor would be bumped once a step and a backward over a graph that saved a
    # parameter would raise where eager runs. Off the CPU it declines: the CPU tier
    # (on_unsupported="cpu") runs the CPU's kernel exactly, else the clear UnsupportedOpError.
    return bool(params) and params[0].device.type != "cpu"


def _adam(adamw: bool, kernel: str):
    def fused_adam_(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
        weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None, _on_clones=False,
    ):  # fmt: skip
        if _off_the_cpu(params) and not _on_clones:
            return NotImplemented
        lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "state_steps": state_steps}
        if amsgrad:
            lists["max_exp_avg_sqs"] = max_exp_avg_sqs
        elif max_exp_avg_sqs:
            raise RuntimeError(
                "Expected max_exp_avg_sqs.size() == 0 to be true, but got false.  (Could this error message be "
                "improved?  If so, please report an enhancement request to PyTorch.)"
            )
        _checks(kernel, params, lists)
        skip = _skip_flag(found_inf)
        constants = (beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale)
        for i, param in enumerate(params):
            max_sq = max_exp_avg_sqs[i] if amsgrad else None
            group = _in_memory_order(param, grads[i], exp_avgs[i], exp_avg_sqs[i], max_sq)
            _adam_step(*group, state_steps[i], lr, constants, skip, adamw)

    return fused_adam_


fused_adam_ = project_decomposition([aten._fused_adam_.default, aten._fused_adam_.tensor_lr])(
    _adam(False, "fused_adam_kernel")
)
fused_adamw_ = project_decomposition([aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr])(
    _adam(True, "fused_adam_kernel")  # (ATen's AdamW runs the Adam kernel in its AdamW mode)
)


@project_decomposition([aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr])
def fused_sgd_(
    params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
    is_first_step, grad_scale=None, found_inf=None, _on_clones=False,
):  # fmt: skip
    if _off_the_cpu(params) and not _on_clones:
        return NotImplemented
    lists = {"grads": grads}
    if momentum != 0:
        lists["momentum_buffer_list"] = momentum_buffer_list
    _checks("fused_sgd_kernel", params, lists)
    for p in params:
        if p.dtype in (torch.float16, torch.bfloat16):
            # NOTE: ATen's CPU kernel for 16-bit floats never stores the parameters of its vector
            # loop (all but the tail of each 32-element block keep their value) and reads the momentum
            # buffer as float32: a result no pointwise program reproduces, and not SGD's
            raise UnsupportedOpError(
                aten._fused_sgd_.default,
                reason=f"the CPU's fused SGD kernel updates {p.dtype} parameters only in part (a PyTorch "
                "kernel bug), so no decomposition matches it",
                hint="use float32 parameters, or SGD(fused=False) for 16-bit ones",
            )
    skip = _skip_flag(found_inf)
    for i, param in enumerate(params):
        buf = momentum_buffer_list[i] if momentum != 0 else None
        param, grad, buf = _in_memory_order(param, grads[i], buf)
        op = _opmath(param.dtype)
        neg_lr = _as(aten.neg.default(lr), op) if isinstance(lr, torch.Tensor) else -lr
        p = _as(param, op)
        g = _unscaled_grad(grad, op, grad_scale, skip)
        if maximize:
            g = aten.neg.default(g)
        if weight_decay != 0:
            g = aten.add.Tensor(g, aten.mul.Tensor(p, weight_decay))
        if momentum != 0:
            new_buf = g
            if not is_first_step:
                new_buf = aten.add.Tensor(aten.mul.Tensor(_as(buf, op), momentum), aten.mul.Tensor(g, 1 - dampening))
            _store(buf, new_buf, skip)
            g = aten.add.Tensor(g, aten.mul.Tensor(new_buf, momentum)) if nesterov else new_buf
        _store(param, aten.add.Tensor(p, aten.mul.Tensor(g, neg_lr)), skip)


def _functional(inplace, n_written: int):
    """The functional form of ``inplace``: its first ``n_written`` lists cloned, stepped, returned."""

    def functional(*args, **kwargs):
        lists = [[aten.clone.default(t) for t in ts] for ts in args[:n_written]]
        inplace(*lists, *args[n_written:], **kwargs, _on_clones=True)  # (fresh tensors: no versions to keep)
        return tuple(lists)

    return functional


project_decomposition([aten._fused_adam.default, aten._fused_adam.tensor_lr])(_functional(fused_adam_, 5))
project_decomposition([aten._fused_adamw.default, aten._fused_adamw.tensor_lr])(_functional(fused_adamw_, 5))
project_decomposition([aten._fused_sgd.default, aten._fused_sgd.tensor_lr])(_functional(fused_sgd_, 3))
