"""Scaled dot-product attention: the fused kernels' ops, in core ops.

``F.scaled_dot_product_attention`` is CompositeImplicitAutograd: it picks a kernel
and calls its op, and that op is what reaches the mode. On CPU that is
``_scaled_dot_product_flash_attention_for_cpu`` (and its backward), or the math
path ``_scaled_dot_product_attention_math`` (dropout, zero-length sequences),
itself composite; on CUDA the flash, memory-efficient and cuDNN ops. PyTorch
has no decomposition for any of the fused backwards, and its one for the CPU
forward returns the attention matrix where the kernel returns the logsumexp.

One computation serves every fused op, as the kernels compute it:

* scores ``q @ k^T * scale`` (+ additive mask, or -inf where a bool mask or
  top-left ``is_causal`` drops a key) in the accumulation dtype (float32 for
  half types);
* grouped-query attention (fewer key/value heads): query head ``h`` reads
  key/value head ``h // (Hq // Hkv)``, and the backward sums the key/value
  gradients over each group;
* the softmax subtracts each row's maximum and divides once at the end, with
  a row whose every score is -inf given a maximum of 0: its probabilities are
  exactly 0, its output 0, never ``exp(-inf - -inf)``. A row of
  ``finfo.min`` scores (``transformers``' additive masks) is uniform, as in the
  kernels, because its maximum is subtracted before ``exp`` rather than its
  logsumexp, which loses ``log(S)`` at that magnitude;
* the backward recomputes the probabilities from the saved logsumexp, as the
  kernels do (so a ``finfo.min`` row's gradients are eager's too).

What each kernel returns for a fully masked row (every score -inf) is a row
of :data:`KERNELS`. Dropout in the fused CUDA ops is declined: their backward
regenerates the mask from a Philox seed that core ATen's ``rand`` cannot
replay. The math op keeps its own CompositeImplicitAutograd kernel (see the
note below :data:`KERNELS`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from eagerdecomp.decompositions.numerics import opmath
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_INF = float("inf")


class Kernel(NamedTuple):
    """A fused kernel's conventions for rows whose every score is -inf."""

    masked_lse: float  # the logsumexp it saves for such a row (its output there is 0)
    lse_dtype: torch.dtype | None  # None: the accumulation dtype


# NOTE: found by running the CPU kernel (out 0, logsumexp 0.0) and from the CUDA
# sources: the memory-efficient kernel divides by max(sum, 1) for a row whose sum is 0
# and writes max + log(sum) = -inf. Flash (CUDA) takes no mask, so no row is fully
# masked there; cuDNN could not be run here (no GPU) and follows the
# memory-efficient kernel's definition, the one every other kernel agrees with (0).
KERNELS = {
    "flash_cpu": Kernel(masked_lse=0.0, lse_dtype=None),
    "efficient": Kernel(masked_lse=-_INF, lse_dtype=torch.float32),
    "flash_cuda": Kernel(masked_lse=-_INF, lse_dtype=torch.float32),
    "cudnn": Kernel(masked_lse=-_INF, lse_dtype=torch.float32),
}

# NOTE: _scaled_dot_product_attention_math has no entry here on purpose: it is
# CompositeImplicitAutograd, so the lowering runs PyTorch's own math kernel, which is
# the native answer itself (_safe_softmax gives 0 on fully masked rows, an explicit
# dropout_mask is applied exactly, dropout draws through eagerdecomp's random ops).


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _pin(*sizes) -> list:
    """``sizes`` as ints; over symbolic sizes, each read adds a guard pinning it (see below)."""
    return [int(n) for n in sizes]


def _check_inputs(name, query, key, value, attn_mask=None):
    """The shapes the fused kernels define; eager's kernels check some and read out of
    bounds on others (a key/value head count that does not divide the query's)."""
    torch._check(
        query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
        lambda: f"{name}: query, key and value must be 4-D [B, H, L, E], got {query.dim()}, {key.dim()}, {value.dim()}",
    )
    torch._check(
        query.dtype == key.dtype == value.dtype and query.dtype.is_floating_point,
        lambda: (
            f"{name}: query, key and value must share one floating dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        ),
    )
    torch._check(
        query.shape[0] == key.shape[0] == value.shape[0],
        lambda: f"{name}: batch sizes differ: {query.shape[0]}, {key.shape[0]}, {value.shape[0]}",
    )
    # NOTE: head counts and head sizes are read as ints. A model's architecture fixes them;
    # only batch and sequence lengths change from call to call. So a shape-generic kernel
    # specializes on them (its guard pins each) and their arithmetic stays off sympy: the
    # grouping's floor division of two symbols was about a third of a symbolic trace.
    hq, hk, hv = _pin(query.shape[1], key.shape[1], value.shape[1])
    _pin(query.shape[-1], key.shape[-1], value.shape[-1])
    torch._check(
        hk == hv and hk > 0 and hq % hk == 0,
        lambda: f"{name}: {hq} query heads cannot be grouped over {hk} key and {hv} value heads",
    )
    torch._check(
        key.shape[2] == value.shape[2] and query.shape[-1] == key.shape[-1],
        lambda: f"{name}: key {list(key.shape)}, value {list(value.shape)} and query {list(query.shape)} do not fit",
    )
    torch._check(
        query.shape[2] > 0 and key.shape[2] > 0,
        lambda: f"{name}: zero-length sequences are not defined for this kernel (SDPA sends them to the math path)",
    )
    if attn_mask is not None:
        torch._check(
            attn_mask.dim() in (2, 4),
            lambda: f"{name}: the attention mask must be 2-D or 4-D, got {attn_mask.dim()}-D",
        )


def _expand_heads(t, heads):
    """[B, Hkv, S, E] -> [B, heads, S, E]: query head h reads key/value head h // group."""
    b, hkv, s, e = t.shape
    (hkv,) = _pin(hkv)  # (see _check_inputs)
    if hkv == heads:
        return t
    # NOTE: the copy reshape makes of an expanded tensor, spelled out: reshape would first
    # work out whether a view can do it, over symbolic sizes
    grouped = t.unsqueeze(2).expand(b, hkv, heads // hkv, s, e)
    return aten.view.default(aten.clone.default(grouped, memory_format=torch.contiguous_format), [b, heads, s, e])


def _sum_groups(grad, hkv):
    """The inverse of :func:`_expand_heads` for gradients: sum each group's heads."""
    b, heads, s, e = grad.shape
    (heads,) = _pin(heads)
    if heads == hkv:
        return grad
    return grad.reshape(b, hkv, heads // hkv, s, e).sum(2)


def _scores(q, k, mask, is_causal, scale):
    """Scaled, masked scores [B, H, L, S] in q's (accumulation) dtype."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:  # top-left aligned, as tril(ones(L, S))
        rows = torch.arange(L, device=q.device).unsqueeze(-1)
        keep = rows >= torch.arange(S, device=q.device)
        scores = scores.masked_fill(keep.logical_not(), -_INF)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(mask.logical_not(), -_INF)
        else:
            scores = scores + mask.to(scores.dtype)
    return scores


def _operands(query, key, value):
    acc, (heads,) = opmath(query.dtype), _pin(query.shape[1])
    return query.to(acc), _expand_heads(key, heads).to(acc), _expand_heads(value, heads).to(acc)


def _forward(kernel: Kernel, query, key, value, mask, is_causal, scale):
    """(output [B, H, L, Ev] in query's dtype, logsumexp [B, H, L])."""
    q, k, v = _operands(query, key, value)
    scores = _scores(q, k, mask, is_causal, _scale(query, scale))
    row_max = scores.amax(-1, keepdim=True)
    masked = row_max == -_INF  # every key dropped: probabilities 0, not exp(-inf - -inf)
    row_max = torch.where(masked, 0.0, row_max)
    probs = torch.exp(scores - row_max)
    total = probs.sum(-1, keepdim=True)
    out = torch.matmul(probs, v) / torch.where(masked, 1.0, total)
    lse = torch.where(masked, kernel.masked_lse, row_max + torch.log(total)).squeeze(-1)
    return out.to(query.dtype), lse.to(kernel.lse_dtype or q.dtype)


def _backward(grad_out, query, key, value, out, lse, mask, is_causal, scale):
    """(grad_query, grad_key, grad_value, grad_scores); key/value grads summed per group."""
    q, k, v = _operands(query, key, value)
    scale = _scale(query, scale)
    scores = _scores(q, k, mask, is_causal, scale)
    lse = lse.to(q.dtype).unsqueeze(-1)
    # a saved -inf (a fully masked row, efficient/cuDNN) drops the row, as its output was 0
    lse = torch.where(lse == -_INF, _INF, lse)
    probs = torch.exp(scores - lse)
    g = grad_out.to(q.dtype)
    grad_v = torch.matmul(probs.transpose(-2, -1), g)
    grad_p = torch.matmul(g, v.transpose(-2, -1))
    delta = (g * out.to(q.dtype)).sum(-1, keepdim=True)
    grad_s = probs * (grad_p - delta)
    grad_q = torch.matmul(grad_s, k) * scale
    grad_k = torch.matmul(grad_s.transpose(-2, -1), q) * scale
    (hkv,) = _pin(key.shape[1])
    return (
        grad_q.to(query.dtype),
        _sum_groups(grad_k, hkv).to(key.dtype),
        _sum_groups(grad_v, hkv).to(value.dtype),
        grad_s,
    )


def _philox(query, shape, dtype):
    # NOTE: seed and offset of a run without dropout: placeholders the backward ignores.
    # On the query's device, where fake tensors put the meta kernel's (the trace checks
    # against those; the CUDA kernels leave them on the host).
    return torch.empty(shape, dtype=dtype, device=query.device)


def _square_if_causal(query, key, is_causal):
    # NOTE: FlashAttention-2 aligns a non-square causal mask to the bottom right, every
    # other kernel (and SDPA's contract) to the top left; SDPA never sends that case to
    # it, so it is declined rather than guessed.
    return not is_causal or query.shape[2] == key.shape[2]


# -- CPU ------------------------------------------------------------------------------


@project_decomposition(aten._scaled_dot_product_flash_attention_for_cpu.default)
def flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    # NOTE: the CPU kernel rejects dropout itself (SDPA takes the math path for it)
    name = "_scaled_dot_product_flash_attention_for_cpu"
    _check_inputs(name, query, key, value, attn_mask)
    torch._check(dropout_p == 0.0, lambda: f"{name}: dropout > 0 is not supported by this kernel")
    torch._check(
        attn_mask is None or attn_mask.dtype == query.dtype,
        lambda: f"{name}: the attention mask must have the query's dtype {query.dtype}, got {attn_mask.dtype}",
    )
    torch._check(value.shape[-1] == query.shape[-1], lambda: f"{name}: query, key and value need one head size")
    return _forward(KERNELS["flash_cpu"], query, key, value, attn_mask, is_causal, scale)


@project_decomposition(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def flash_cpu_backward(
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    name = "_scaled_dot_product_flash_attention_for_cpu_backward"
    _check_inputs(name, query, key, value, attn_mask)
    torch._check(dropout_p == 0.0, lambda: f"{name}: dropout > 0 is not supported by this kernel")
    return _backward(grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale)[:3]


# -- CUDA: traced and tested on CPU and fake tensors against their meta kernels -------------


@project_decomposition(aten._scaled_dot_product_efficient_attention.default)
def efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    # NOTE: the kernel (and its meta kernel's gradient shapes) has no grouped heads
    if dropout_p != 0.0 or key.shape[1] != query.shape[1]:
        return NotImplemented
    _check_inputs("_scaled_dot_product_efficient_attention", query, key, value)
    out, lse = _forward(KERNELS["efficient"], query, key, value, attn_bias, is_causal, scale)
    L = query.shape[2]
    if not compute_log_sumexp:
        lse = lse.new_empty((*lse.shape[:2], 0))
    elif L % 32:  # rows padded to a multiple of 32 with +inf, as the kernel writes them
        lse = torch.cat([lse, lse.new_full((*lse.shape[:2], 32 - L % 32), _INF)], -1)
    return out, lse, _philox(query, (), torch.int64), _philox(query, (), torch.int64)


@project_decomposition(aten._scaled_dot_product_efficient_attention_backward.default)
def efficient_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    *,
    scale=None,
):
    if dropout_p != 0.0 or key.shape[1] != query.shape[1]:
        return NotImplemented
    _check_inputs("_scaled_dot_product_efficient_attention_backward", query, key, value)
    lse = logsumexp[..., : query.shape[2]]
    gq, gk, gv, grad_s = _backward(grad_out, query, key, value, out, lse, attn_bias, is_causal, scale)
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        grad_bias = grad_s.sum_to_size(attn_bias.shape).to(attn_bias.dtype)
    return gq, gk, gv, grad_bias


@project_decomposition(aten._scaled_dot_product_flash_attention.default)
def flash_cuda(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p != 0.0 or return_debug_mask or not _square_if_causal(query, key, is_causal):
        return NotImplemented
    _check_inputs("_scaled_dot_product_flash_attention", query, key, value)
    out, lse = _forward(KERNELS["flash_cuda"], query, key, value, None, is_causal, scale)
    L, S = query.shape[2], key.shape[2]
    seed, offset = _philox(query, (2,), torch.uint64), _philox(query, (), torch.uint64)
    return out, lse, None, None, L, S, seed, offset, query.new_empty(0)


@project_decomposition(aten._scaled_dot_product_flash_attention_backward.default)
def flash_cuda_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    # NOTE: cum_seq_q/k are the packed variable-length (nested tensor) layout
    if dropout_p != 0.0 or cum_seq_q is not None or cum_seq_k is not None:
        return NotImplemented
    if not _square_if_causal(query, key, is_causal):
        return NotImplemented
    _check_inputs("_scaled_dot_product_flash_attention_backward", query, key, value)
    return _backward(grad_out, query, key, value, out, logsumexp, None, is_causal, scale)[:3]


@project_decomposition(aten._scaled_dot_product_cudnn_attention.default)
def cudnn(
    query,
    key,
    value,
    attn_bias,
    compute_log_sumexp,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    *,
    scale=None,
):
    if dropout_p != 0.0 or return_debug_mask:
        return NotImplemented
    _check_inputs("_scaled_dot_product_cudnn_attention", query, key, value)
    out, lse = _forward(KERNELS["cudnn"], query, key, value, attn_bias, is_causal, scale)
    L, S = query.shape[2], key.shape[2]
    seed, offset = _philox(query, (), torch.int64), _philox(query, (), torch.int64)
    return out, lse.unsqueeze(-1), None, None, L, S, seed, offset, None


@project_decomposition(aten._scaled_dot_product_cudnn_attention_backward.default)
def cudnn_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    attn_bias,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    *,
    scale=None,
):
    if dropout_p != 0.0 or cum_seq_q is not None or cum_seq_k is not None:
        return NotImplemented
    _check_inputs("_scaled_dot_product_cudnn_attention_backward", query, key, value)
    lse = logsumexp.squeeze(-1) if logsumexp.dim() == 4 else logsumexp
    return _backward(grad_out, query, key, value, out, lse, attn_bias, is_causal, scale)[:3]
