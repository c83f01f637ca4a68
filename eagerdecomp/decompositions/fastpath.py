"""The transformer "fast path": the fused inference ops of ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer``, in core ops.

In eval mode with autograd off (``torch.no_grad()`` or nothing requiring grad), with
``batch_first=True`` and an even head count, ``nn.MultiheadAttention`` calls
``_native_multi_head_attention`` and ``nn.TransformerEncoderLayer`` (so
``nn.TransformerEncoder``) calls ``_transformer_encoder_layer_fwd``, on CPU, CUDA and the
PrivateUse1 backend alike. PyTorch has no decomposition for either, nor for the two
helpers the first one's CPU kernel is built from (``_transform_bias_rescale_qkv`` and
``_masked_softmax``), so every inference run of a stock transformer stopped there.

Each decomposition follows the CPU kernel (``aten/src/ATen/native/transformers/attention.cpp``,
``transformer.cpp`` and ``SoftMax.cpp``), step by step and in the same dtype:

* the projection of query, key and value (one matrix product when they are one tensor);
* ``_transform_bias_rescale_qkv``: the bias added, then q multiplied by ``1/sqrt(head
  size)`` (that constant rounded as the kernel rounds it), *before* ``q @ k^T``; the three
  results are views of one ``[3, B, H, T, head size]`` buffer, as the kernel's;
* ``_masked_softmax`` by mask type: 0 an ``[L, L]`` mask shared by the batch and the
  heads, 1 a ``[B, L]`` key padding mask, 2 a mask of the scores' own shape; ``True``
  drops a key, and a float mask is made ``bool`` first (any nonzero value drops a key,
  ``-inf`` and ``0.5`` alike). A row whose every key is dropped is NaN, as the kernel
  leaves it (it multiplies by NaN where the sum of its exponentials is 0): the fast
  path differs there from the module's own Python path, whose ``_safe_softmax`` gives 0;
* the weights ``[B, H, L, L]``, averaged over the heads (summed, then divided) when
  ``average_attn_weights``; ``None`` when ``need_weights`` is false, as eager returns it
  (the meta kernel says an empty tensor; a None is not checked against it);
* the encoder layer: layer norm before (``norm_first``) or after each residual block,
  the feed-forward block as ``addmm`` then the activation, the residuals added to the
  block outputs.

The matrix products, softmaxes and layer norms are the kernels' own ops, and the steps
between them round where the kernels round (in the kernels' accumulation types). So the
half types come out bit for bit as the CPU kernels', and float32 and float64 too but
where a mask is given: the masked softmax's kernel takes the C library's ``exp`` of each
element, ``aten.exp`` a vectorized one, and they differ in the last bit. On CUDA the
attention op sends self-attention without mask or weights to its fused SDPA kernels
instead (CPU has no fused choice there): that agrees with this computation to rounding.

Declined (a clear error naming the op, never another answer): nested tensors (the
packed variable-length layout is outside Core ATen's strided tensors), and the calls
where eager's own kernel crashes, reads out of bounds or writes a scrambled result (each
has its NOTE below).
"""

from __future__ import annotations

import math

import torch
from torch._prims_common import compute_elementwise_output_strides, make_contiguous_strides_for

from eagerdecomp.decompositions.numerics import cast, opmath, to_float32
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_INF = float("inf")
_HALVES = (torch.float16, torch.bfloat16)


def _nested(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_nested for t in tensors)


# -- the scale of q ---------------------------------------------------------------------


def _inv_sqrt(head_size: int, dtype) -> float:
    """1 / sqrt(head size) as the kernel computes it for ``dtype`` (float32 or float64)."""
    # NOTE: the square root taken in the computation type (float for float32), the division
    # in double, the quotient stored back in the computation type; q is multiplied by it
    if dtype == torch.float64:
        return 1.0 / math.sqrt(head_size)
    return to_float32(1.0 / to_float32(math.sqrt(to_float32(float(head_size)))))


@project_decomposition(aten._transform_bias_rescale_qkv.default)
def transform_bias_rescale_qkv(qkv, qkv_bias, num_heads):
    """``[B, T, 3D]`` -> q, k, v ``[B, H, T, D/H]``: bias added, q scaled by 1/sqrt(D/H)."""
    if _nested(qkv, qkv_bias):
        return NotImplemented
    name = "_transform_bias_rescale_qkv"
    torch._check(qkv.dim() == 3, lambda: f"{name}: qkv must be [B, T, 3 * embed_dim], got {qkv.dim()}-D")
    torch._check_not_implemented(
        qkv.dtype.is_floating_point, lambda: f"{name}: not implemented for {qkv.dtype} (floating types only)"
    )
    B, T, three_d = qkv.shape
    three_d = int(three_d)  # a weight's size: fixed by the model
    D = three_d // 3
    torch._check(num_heads > 0 and D % num_heads == 0, lambda: f"{name}: {num_heads} heads do not divide {D}")
    torch._check(three_d % 3 == 0, lambda: f"{name}: the last size {three_d} is not 3 * embed_dim")
    # NOTE: the kernel reads the bias as 3 * D values of qkv's type in a row and checks
    # neither its shape (a short one is read past its end) nor its dtype (a float64 bias
    # of float32 qkv is read as garbage): only the bias it means is accepted. And with
    # B == 0 it splits an empty buffer into fewer than three pieces and crashes.
    if tuple(qkv_bias.shape) != (three_d,) or qkv_bias.dtype != qkv.dtype or B == 0:
        return NotImplemented
    H, E = num_heads, D // num_heads
    dtype, acc = qkv.dtype, opmath(qkv.dtype)
    if not qkv.is_contiguous():
        qkv = aten.clone.default(qkv, memory_format=torch.contiguous_format)
    # NOTE: for the half types the kernel adds the bias and scales q in float and rounds
    # once (found by running it: rounding the sum first differs by an ulp); so here
    ones = aten.full.default([2 * D], 1.0, dtype=acc, device=qkv.device)
    scale = aten.full.default([D], _inv_sqrt(E, acc), dtype=acc, device=qkv.device)
    # q scaled, k and v multiplied by 1 (exact): one pass over the [B, T, 3D] block
    t = aten.mul.Tensor(aten.add.Tensor(cast(qkv, acc), cast(qkv_bias, acc)), aten.cat.default([scale, ones]))
    t = aten.permute.default(aten.view.default(cast(t, dtype), [B, T, 3, H, E]), [2, 0, 3, 1, 4])
    packed = aten.clone.default(t, memory_format=torch.contiguous_format)  # [3, B, H, T, E]
    q, k, v = aten.split.Tensor(aten.view.default(packed, [3 * B, H, T, E]), B)
    return q, k, v


# -- masked softmax ---------------------------------------------------------------------


def _scrambled(t) -> bool:
    """Whether eager's kernel would write ``t``'s result in the wrong order: it allocates
    its output with ``t``'s own layout and fills it as if it were contiguous."""
    if t.numel() <= 1:
        return False
    like = compute_elementwise_output_strides(t)
    contiguous = make_contiguous_strides_for(t.shape)
    return any(n > 1 and a != b for n, a, b in zip(t.shape, like, contiguous))


# NOTE: the type in which the CPU kernel sums a row's exponentials and takes the
# reciprocal of the sum: CPU's accumulation type, double for float32 (as embedding_bag's
# scales are kept), float for the half types
_CPU_ACC = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def _softmax(scores, drop, dim):
    """Softmax of ``scores`` over ``dim`` without the keys where ``drop`` (broadcast) is
    True, rounded where the kernel rounds: a row with nothing left is NaN."""
    dtype = scores.dtype
    acc = _CPU_ACC.get(dtype, dtype)
    s = aten.where.self(drop, aten.scalar_tensor.default(-_INF, dtype=dtype, device=scores.device), scores)
    top = aten.amax.default(s, [dim], True)
    # NOTE: the kernel stores each difference and each exponential in the scores' own type
    # (a half type included), sums them in its accumulation type and multiplies each by
    # the sum's reciprocal rather than divide by the sum. A half type stores the
    # reciprocal in itself first; float32 multiplies by the double one (a double product,
    # rounded once).
    z = aten.exp.default(aten.sub.Tensor(s, top))  # -inf - -inf: NaN for an emptied row
    inv = aten.reciprocal.default(aten.sum.dim_IntList(cast(z, acc), [dim], True))
    if dtype in _HALVES:
        return aten.mul.Tensor(z, cast(inv, dtype))
    return cast(aten.mul.Tensor(cast(z, acc), inv), dtype)


@project_decomposition(aten._masked_softmax.default)
def masked_softmax(input, mask, dim=None, mask_type=None):
    """Softmax over ``dim`` (default the last) of the keys ``mask`` (by ``mask_type``) keeps."""
    if _nested(input, mask):
        return NotImplemented
    name = "_masked_softmax"
    torch._check(mask.dtype == torch.bool, lambda: f"{name}: the mask must be bool, got {mask.dtype}")
    torch._check_not_implemented(
        input.dtype.is_floating_point, lambda: f"{name}: not implemented for {input.dtype} (floating types only)"
    )
    kind = mask_type
    if mask.dim() != 2 or input.dim() != 4:  # the 2-D mask types exist for 4-D scores only
        kind = 2
    if kind == 2:
        torch._check(
            tuple(mask.shape) == tuple(input.shape),
            lambda: (
                f"{name}: a generic mask (type 2) must have the input's shape {list(input.shape)}, "
                f"got {list(mask.shape)}"
            ),
        )
        drop = mask
    elif kind in (0, 1):
        B, _, L, S = input.shape
        if kind == 1:
            torch._check(
                mask.shape[0] == B and mask.shape[1] == L,
                lambda: f"{name}: a key padding mask (type 1) must be [B, L] = {[B, L]}, got {list(mask.shape)}",
            )
        else:
            torch._check(
                mask.shape[0] == L and mask.shape[1] == L,
                lambda: f"{name}: an attention mask (type 0) must be [L, L] = {[L, L]}, got {list(mask.shape)}",
            )
        # NOTE: the kernel checks these masks against the scores' rows (L) but reads them
        # with the length of the softmax's rows (S): for L != S it reads past their end
        # (or fails to expand them), so only the self-attention shape is accepted
        if S != L:
            return NotImplemented
        drop = aten.view.default(mask, [B, 1, 1, S]) if kind == 1 else mask
    else:
        torch._check(mask_type is not None, lambda: f"{name}: a 2-D mask needs a mask_type (0, 1 or 2)")
        torch._check(False, lambda: f"{name}: mask_type must be 0, 1 or 2, got {mask_type}")
    # NOTE: an input whose layout is not contiguous gets an output with that layout, which
    # the kernel fills in contiguous order (the values land in the wrong places); and a
    # softmax over an empty dimension divides by zero in the kernel. Both declined.
    if _scrambled(input):
        return NotImplemented
    ndim = max(input.dim(), 1)
    d = ndim - 1 if dim is None else dim
    torch._check(-ndim <= d < ndim, lambda: f"{name}: dim {dim} is out of range for a {input.dim()}-D input")
    d %= ndim
    if input.dim() == 0:
        return aten.view.default(_softmax(aten.view.default(input, [1]), aten.view.default(drop, [1]), 0), [])
    if input.shape[d] == 0:
        return NotImplemented
    return _softmax(input, drop, d)


# -- multi-head attention ---------------------------------------------------------------


def _gemm_nt(x, w):
    return aten.matmul.default(x, aten.t.default(w))


def _qkv_projection(query, key, value, D, qkv_weight):
    """``[B, T, 3D]``: one product for self-attention, one per distinct input otherwise."""
    if key is value:
        if query is key:
            return _gemm_nt(query, qkv_weight)
        wq, wkv = aten.split_with_sizes.default(qkv_weight, [D, 2 * D])
        return aten.cat.default([_gemm_nt(query, wq), _gemm_nt(key, wkv)], 2)
    wq, wk, wv = aten.split.Tensor(qkv_weight, D)
    return aten.cat.default([_gemm_nt(query, wq), _gemm_nt(key, wk), _gemm_nt(value, wv)], 2)


def _check_mha(query, key, value, D, num_head, qkv_weight, qkv_bias):
    name = "_native_multi_head_attention"
    torch._check(query.dim() == 3, lambda: f"{name}: query must be 3-D [B, T, D], got {query.dim()}-D")
    torch._check(query.shape[2] == D, lambda: f"{name}: embed_dim {D} is not query's last size {query.shape[2]}")
    torch._check(key.dim() == 3 and value.dim() == 3, lambda: f"{name}: key and value must be 3-D")
    torch._check(
        tuple(query.shape) == tuple(key.shape) == tuple(value.shape),
        lambda: (
            f"{name}: query, key and value must have one shape, got "
            f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}"
        ),
    )
    torch._check(
        qkv_weight.dim() == 2 and tuple(qkv_weight.shape) == (3 * D, D),
        lambda: f"{name}: qkv_weight must be [3 * embed_dim, embed_dim] = {[3 * D, D]}, got {list(qkv_weight.shape)}",
    )
    torch._check(
        qkv_bias.dim() == 1 and qkv_bias.shape[0] == 3 * D,
        lambda: f"{name}: qkv_bias must be [3 * embed_dim] = {[3 * D]}, got {list(qkv_bias.shape)}",
    )
    torch._check(num_head > 0 and D % num_head == 0, lambda: f"{name}: {num_head} heads do not divide embed_dim {D}")


@project_decomposition(aten._native_multi_head_attention.default)
def native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    if _nested(query, key, value, mask):
        return NotImplemented
    D, H = embed_dim, num_head
    _check_mha(query, key, value, D, H, qkv_weight, qkv_bias)
    qkv = _qkv_projection(query, key, value, D, qkv_weight)
    if qkv.numel() == 0:
        return aten.empty_like.default(query), None
    q, k, v = aten._transform_bias_rescale_qkv.default(qkv, qkv_bias, H)
    B, _, T, E = q.shape
    k_t = aten.transpose.int(aten.view.default(k, [B * H, T, E]), 1, 2)
    scores = aten.bmm.default(aten.view.default(q, [B * H, T, E]), k_t)
    scores = aten.view.default(scores, [B, H, T, T])
    if mask is None:
        probs = aten._softmax.default(scores, 3, False)
    else:
        probs = aten._masked_softmax.default(scores, cast(mask, torch.bool), 3, mask_type)
    ctx = aten.bmm.default(aten.view.default(probs, [B * H, T, T]), aten.view.default(v, [B * H, T, E]))
    # heads side by side again: [B, H, T, E] -> [B * T, D]
    ctx = aten.permute.default(aten.view.default(ctx, [B, H, T, E]), [0, 2, 1, 3])
    ctx = aten.view.default(aten.clone.default(ctx, memory_format=torch.contiguous_format), [B * T, H * E])
    out = aten.addmm.default(proj_bias, ctx, aten.t.default(proj_weight))
    out = aten.view.default(out, [B, T, out.shape[1]])
    if not need_weights:
        return out, None
    if average_attn_weights:
        probs = aten.div.Tensor(aten.sum.dim_IntList(probs, [1]), H)
    return out, probs


# -- the encoder layer ------------------------------------------------------------------


def _norm(x, D, eps, weight, bias):
    return aten.native_layer_norm.default(x, [D], weight, bias, eps)[0]


def _ffn(x, w1, b1, w2, b2, use_gelu):
    """linear, activation, linear: each linear one ``addmm`` over the ``[B * T, D]`` rows."""
    name = "_transformer_encoder_layer_fwd"
    torch._check(x.dim() == 3, lambda: f"{name}: the input must be 3-D [B, T, D], got {x.dim()}-D")
    torch._check(w1.dim() == 2 and w2.dim() == 2, lambda: f"{name}: the feed-forward weights must be 2-D")
    B, T, D = x.shape
    h = aten.addmm.default(b1, aten.view.default(x, [B * T, D]), aten.t.default(w1))
    # NOTE: the kernel's _addmm_activation applies the exact GELU on CPU and the tanh
    # approximation on CUDA (cuBLASLt's epilogue; PyTorch's own decomposition of it makes
    # the same distinction); every other device follows the CPU
    if use_gelu:
        h = aten.gelu.default(h, approximate="tanh" if h.device.type == "cuda" else "none")
    else:
        h = aten.relu.default(h)
    y = aten.addmm.default(b2, h, aten.t.default(w2))
    return aten.view.default(y, [B, T, y.shape[1]])


@project_decomposition(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    if _nested(src, mask):
        return NotImplemented
    if src.numel() == 0:
        return aten.clone.default(src)
    # NOTE: eager's result is always contiguous (a layer norm's output, or a fresh sum), a
    # permuted src's included (the meta kernel keeps its layout: corrected in exact.py)
    D = embed_dim
    x = _norm(src, D, eps, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten._native_multi_head_attention.default(
        x, x, x, D, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
    )[0]
    x = aten.add.Tensor(x, src)
    if not norm_first:
        x = _norm(x, D, eps, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = _norm(x, D, eps, norm_weight_2, norm_bias_2)
    x = aten.add.Tensor(_ffn(x, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, use_gelu), residual)
    if not norm_first:
        x = _norm(x, D, eps, norm_weight_2, norm_bias_2)
    return x
