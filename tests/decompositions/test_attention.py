"""Scaled dot-product attention under the mode matches native, forward and backward.

Every form the fused kernels accept (grouped-query heads, causal, bool and additive
masks with fully masked rows, explicit scale, single-token decoding against a long
cache) at the four float dtypes; the SDPA ops themselves, including the CUDA ones,
traced on CPU and checked against their meta kernels; and a decoder-only
``transformers`` model with grouped-query attention that trains and generates as native.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch._prims_common import check_significant_strides
from torch._subclasses.fake_tensor import FakeTensorMode

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# heads of query over heads of key/value: 1 (multi-head), 2 and 4 (grouped-query)
GROUPS = [1, 2, 4]


def _keep(B, L, S, generator):
    """A bool mask that drops some keys and every key of query rows 0-1 of batch 0."""
    keep = torch.rand(B, 1, L, S, generator=generator) > 0.3
    keep[0, :, :2] = False
    return keep


def _mask(form, dtype, B, L, S, generator):
    if form in ("bool", "neg_inf", "finfo_min"):
        keep = _keep(B, L, S, generator)
        if form == "bool":
            return keep
        fill = float("-inf") if form == "neg_inf" else torch.finfo(dtype).min
        return torch.zeros(B, 1, L, S, dtype=dtype).masked_fill(~keep, fill)
    return None


# form -> (L, S, sdpa keyword arguments other than the mask)
FORMS = {
    "plain": (5, 7, {}),
    "causal": (6, 6, {"is_causal": True}),
    "causal_rect": (4, 9, {"is_causal": True}),
    "scale": (5, 7, {"scale": 0.3}),
    "bool": (5, 7, {}),  # fully masked rows: native gives 0
    "neg_inf": (5, 7, {}),
    "finfo_min": (5, 7, {}),  # transformers' additive mask: a uniform row
    "decode": (1, 48, {}),  # one new token against a long KV cache
}


def _sdpa_inputs(dtype, group, form, seed=0):
    g = torch.Generator().manual_seed(seed)
    L, S, kwargs = FORMS[form]
    B, Hkv, E = 2, 2, 16
    q = torch.randn(B, Hkv * group, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, E, generator=g, dtype=torch.float64)
    grad = torch.randn(B, Hkv * group, L, E, generator=g, dtype=torch.float64)
    mask = _mask(form, dtype, B, L, S, g)
    kwargs = dict(kwargs, attn_mask=mask, enable_gqa=group > 1)
    return [t.to(dtype) for t in (q, k, v, grad)], kwargs


def _sdpa_and_grads(q, k, v, grad, kwargs):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def _in_float64(kwargs):
    mask = kwargs["attn_mask"]
    return dict(kwargs, attn_mask=mask.double() if mask is not None and mask.is_floating_point() else mask)


def _assert_like_native(ours, native, reference):
    """Same dtype, shape and significant strides as native; values as close to the float64
    reference as native's (reduced precision) or close to native (float32/64); no NaN."""
    for o, n, r in zip(ours, native, reference):
        assert o.dtype == n.dtype and o.shape == n.shape
        assert check_significant_strides(o, n, only_cuda=False)[0], (o.stride(), n.stride())
        assert not o.isnan().any() and not n.isnan().any()
        if o.dtype in (torch.float32, torch.float64):
            torch.testing.assert_close(o, n)
        else:
            ulp = torch.finfo(o.dtype).eps * max(1.0, r.abs().max().item())  # one ulp at the result's scale
            torch.testing.assert_close(o, n, rtol=0, atol=2 * ulp)
            # and no further from float64 than native (to a quarter ulp)
            err_ours = (o.double() - r).abs().max().item()
            err_native = (n.double() - r).abs().max().item()
            assert err_ours <= 1.25 * err_native + 0.25 * ulp, (err_ours, err_native)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_forward_backward_matches_native(dtype, group, form):
    (q, k, v, grad), kwargs = _sdpa_inputs(dtype, group, form)
    native = _sdpa_and_grads(q, k, v, grad, kwargs)
    reference = _sdpa_and_grads(*(t.double() for t in (q, k, v, grad)), _in_float64(kwargs))
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        ours = _sdpa_and_grads(q, k, v, grad, kwargs)
    rec.assert_only("core_aten")
    _assert_like_native(ours, native, reference)
    routes = {r.op: r.route for r in mode.report().rows}
    assert routes["aten._scaled_dot_product_flash_attention_for_cpu.default"] == "decomposed"
    assert routes["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"] == "decomposed"


def _cpu_flash(q, k, v, mask=None, causal=False):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal, attn_mask=mask)
    return out, lse


@pytest.mark.parametrize("fill", ["neg_inf", "finfo_min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_flash_fully_masked_rows_as_the_kernel(dtype, fill):
    # The kernel returns output 0 and logsumexp 0.0 for a row of -inf scores, and for a
    # row of finfo.min the mean of the values with logsumexp finfo.min (log S is lost at
    # that magnitude); its backward recomputes probabilities from that logsumexp.
    (q, k, v, grad), _ = _sdpa_inputs(dtype, 2, fill)
    mask = _mask(fill, dtype, 2, 5, 7, torch.Generator().manual_seed(1))
    native = _cpu_flash(q, k, v, mask)
    native_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, *native, 0.0, False, attn_mask=mask
    )
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        ours = _cpu_flash(q, k, v, mask)
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, *ours, 0.0, False, attn_mask=mask
        )
    rec.assert_only("core_aten")
    masked_rows = native[1][0, :, :2]
    if fill == "neg_inf":
        assert (native[0][0, :, :2] == 0).all() and (masked_rows == 0).all()
    else:
        assert (masked_rows == torch.finfo(dtype).min).all()
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for o, n in zip((*ours, *grads), (*native, *native_grads)):
        assert o.dtype == n.dtype and check_significant_strides(o, n, only_cuda=False)[0]
        torch.testing.assert_close(o, n, **tol)


@pytest.mark.usefixtures("trace_first")  # shape families of traced kernels
def test_lengths_share_one_kernel_and_head_counts_are_pinned_by_its_guard():
    # batch and sequence lengths stay symbols of the shape-generic kernel; head counts and
    # head sizes are part of its guard, so another architecture traces a member of its own
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    g = torch.Generator().manual_seed(5)
    mode = ed.EagerDecompMode("core_aten")

    def call(B, hq, hkv, L, S, E=16):
        q, k, v = (torch.randn(B, h, n, E, generator=g) for h, n in ((hq, L), (hkv, S), (hkv, S)))
        mask = torch.randn(B, 1, L, S, generator=g)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        with mode:
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        assert (got.shape, got.stride()) == (want.shape, want.stride())
        torch.testing.assert_close(got, want)
        return mode.report().row(op).traces

    ed.cache_clear()
    assert call(2, 4, 2, 5, 7) == 1
    assert [call(B, 4, 2, L, S) for B, L, S in ((3, 6, 9), (2, 11, 4), (4, 2, 30))] == [1, 1, 1]
    assert call(2, 8, 2, 5, 7) == 2  # four query heads per key head: a new member
    assert call(2, 4, 2, 5, 7, E=32) == 3  # another head size: a new member
    assert call(3, 4, 2, 9, 3) == 3  # the first member still answers
    ed.cache_clear()


def test_sdpa_in_inference_mode_reaches_the_mode_whole():
    # NOTE: with autograd off, the composite SDPA op itself reaches the mode and is
    # lowered through its own kernel choice into the fills.
    (q, k, v, _), kwargs = _sdpa_inputs(torch.float32, 2, "bool")
    with torch.inference_mode():
        native = F.scaled_dot_product_attention(q, k, v, **kwargs)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
            ours = F.scaled_dot_product_attention(q, k, v, **kwargs)
    rec.assert_only("core_aten")
    assert "aten.scaled_dot_product_attention.default" in {r.op for r in mode.report().decomposed}
    torch.testing.assert_close(ours, native)
    assert (ours[0, :, :2] == 0).all()


def test_math_path_with_dropout_mask_is_exact():
    # _scaled_dot_product_attention_math keeps PyTorch's own composite kernel
    # (SDPA turns a bool mask into an additive one before this op; it adds what it gets)
    (q, k, v, _), kwargs = _sdpa_inputs(torch.float32, 2, "neg_inf")
    drop = torch.rand(2, 4, 5, 7, generator=torch.Generator().manual_seed(3)) > 0.4
    args = dict(attn_mask=kwargs["attn_mask"], dropout_p=0.4, dropout_mask=drop, enable_gqa=True)
    with torch.inference_mode():
        native = aten._scaled_dot_product_attention_math(q, k, v, **args)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
            ours = aten._scaled_dot_product_attention_math(q, k, v, **args)
    rec.assert_only("core_aten")
    assert "aten._scaled_dot_product_attention_math.default" in {r.op for r in mode.report().decomposed}
    for o, n in zip(ours, native):
        torch.testing.assert_close(o, n)
    assert (ours[0][0, :, :2] == 0).all()  # fully masked rows: 0, as native's _safe_softmax


def test_sdpa_dropout_draws_through_eagerdecomps_random_ops():
    (q, k, v, grad), kwargs = _sdpa_inputs(torch.float32, 2, "plain")
    kwargs = dict(kwargs, dropout_p=0.5)
    outs = []
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        for seed in (7, 7, 8):
            torch.manual_seed(seed)
            outs.append(_sdpa_and_grads(q, k, v, grad, kwargs))
    rec.assert_only("core_aten")
    assert "aten.bernoulli_.float" in {r.op for r in mode.report().decomposed}
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # reproducible under manual_seed
    assert not torch.equal(outs[0][0], outs[2][0])
    undropped = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert not torch.equal(outs[0][0], undropped) and not outs[0][0].isnan().any()


def test_sdpa_dropout_in_inference_mode_draws_fresh_numbers_from_a_kernel():
    # NOTE: here SDPA itself reaches the mode and is traced once, dropout included; the
    # replayed kernel calls core rand again, so each call draws anew and the seed rules
    (q, k, v, _), kwargs = _sdpa_inputs(torch.float32, 2, "plain")
    kwargs = dict(kwargs, dropout_p=0.5)
    outs = []
    with torch.inference_mode(), RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        for seed in (7, 7, 8):
            torch.manual_seed(seed)
            outs.append(F.scaled_dot_product_attention(q, k, v, **kwargs))
    rec.assert_only("core_aten")
    row = next(r for r in mode.report().rows if r.op == "aten.scaled_dot_product_attention.default")
    assert row.route == "decomposed"
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    undropped = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert not torch.equal(outs[0], undropped) and not outs[0].isnan().any()


def test_kv_heads_without_enable_gqa_raise_as_native():
    (q, k, v, _), _ = _sdpa_inputs(torch.float32, 2, "plain")
    with pytest.raises(RuntimeError) as native:
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError) as ours, ed.EagerDecompMode("core_aten"):
        F.scaled_dot_product_attention(q, k, v)
    assert str(ours.value) == str(native.value)


def test_cpu_flash_heads_that_do_not_group_are_an_error():
    # eager's kernel reads out of bounds here; the fill refuses
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="cannot be grouped"), ed.EagerDecompMode("core_aten"):
        _cpu_flash(q, k, k)


# -- the CUDA ops: no CPU kernel, so the mode's decomposition is what runs on CPU tensors ----


def _meta_outputs(op, *args, **kwargs):
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return op(*fake, **kwargs)


def _assert_meta_like(ours, meta):
    assert len(ours) == len(meta)
    for o, m in zip(ours, meta):
        if isinstance(m, torch.Tensor):
            assert (o.dtype, o.shape, o.device) == (m.dtype, m.shape, m.device)
            assert check_significant_strides(o, m, only_cuda=False)[0], (o.stride(), m.stride())
        else:
            assert o == m


def _cuda_op_inputs(group=1, L=5, S=7):
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        torch.randn(2, 2 * group, L, 8, generator=g),
        torch.randn(2, 2, S, 8, generator=g),
        torch.randn(2, 2, S, 8, generator=g),
    )
    keep = _keep(2, L, S, g)
    bias = torch.zeros(2, 2 * group, L, S).masked_fill(~keep, float("-inf"))
    return q, k, v, bias, torch.randn(2, 2 * group, L, 8, generator=g)


def test_efficient_attention_forward_backward():
    q, k, v, bias, grad = _cuda_op_inputs()
    native = _cpu_flash(q, k, v, bias)
    native_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, *native, 0.0, False, attn_mask=bias
    )
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        fwd = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)
        bwd = aten._scaled_dot_product_efficient_attention_backward(grad, q, k, v, bias, *fwd, 0.0, [True] * 4)
    rec.assert_only("core_aten")
    _assert_meta_like(fwd, _meta_outputs(aten._scaled_dot_product_efficient_attention, q, k, v, bias, True))
    _assert_meta_like(
        bwd,
        _meta_outputs(
            aten._scaled_dot_product_efficient_attention_backward, grad, q, k, v, bias, *fwd, 0.0, [True] * 4
        ),
    )
    out, lse = fwd[0], fwd[1]
    torch.testing.assert_close(out, native[0])
    # the kernel's logsumexp: -inf on fully masked rows, rows padded to 32 with +inf
    assert lse.shape[-1] == 32 and (lse[..., 5:] == math.inf).all()
    assert (lse[0, :, :2] == -math.inf).all()
    torch.testing.assert_close(lse[1, :, :5], native[1][1])
    for o, n in zip(bwd[:3], native_grads):
        torch.testing.assert_close(o, n)
    # the bias gradient is the scores' gradient: check against autograd through the math path
    bias_ = bias.clone().requires_grad_()
    ref = aten._scaled_dot_product_attention_math(q, k, v, bias_)[0]
    (ref_bias_grad,) = torch.autograd.grad(ref, bias_, grad)
    torch.testing.assert_close(bwd[3], ref_bias_grad)


@pytest.mark.parametrize("group", GROUPS)
def test_cuda_flash_attention_forward_backward(group):
    q, k, v, _, grad = _cuda_op_inputs(group, L=6, S=6)
    for causal in (False, True):
        native = _cpu_flash(q, k, v, causal=causal)
        native_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, *native, 0.0, causal)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            fwd = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
            bwd_args = (grad, q, k, v, fwd[0], fwd[1], None, None, 6, 6, 0.0, causal, fwd[6], fwd[7])
            bwd = aten._scaled_dot_product_flash_attention_backward(*bwd_args)
        rec.assert_only("core_aten")
        _assert_meta_like(fwd, _meta_outputs(aten._scaled_dot_product_flash_attention, q, k, v, 0.0, causal))
        _assert_meta_like(bwd, _meta_outputs(aten._scaled_dot_product_flash_attention_backward, *bwd_args))
        torch.testing.assert_close(fwd[0], native[0])
        torch.testing.assert_close(fwd[1], native[1])
        for o, n in zip(bwd, native_grads):
            torch.testing.assert_close(o, n)


@pytest.mark.parametrize("group", GROUPS)
def test_cudnn_attention_forward_backward(group):
    q, k, v, bias, grad = _cuda_op_inputs(group)
    native = _cpu_flash(q, k, v, bias)
    native_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, *native, 0.0, False, attn_mask=bias
    )
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        fwd = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)
        bwd_args = (grad, q, k, v, fwd[0], fwd[1], fwd[6], fwd[7], bias, None, None, 5, 7, 0.0, False)
        bwd = aten._scaled_dot_product_cudnn_attention_backward(*bwd_args)
    rec.assert_only("core_aten")
    _assert_meta_like(fwd, _meta_outputs(aten._scaled_dot_product_cudnn_attention, q, k, v, bias, True))
    _assert_meta_like(bwd, _meta_outputs(aten._scaled_dot_product_cudnn_attention_backward, *bwd_args))
    torch.testing.assert_close(fwd[0], native[0])
    assert (fwd[0][0, :, :2] == 0).all() and (fwd[1][0, :, :2] == -math.inf).all()
    torch.testing.assert_close(fwd[1][1, ..., 0], native[1][1])
    for o, n in zip(bwd, native_grads):
        torch.testing.assert_close(o, n)


def test_cuda_ops_on_meta_tensors_match_their_meta_kernels():
    q, k, v, bias, _ = (t.to("meta") for t in _cuda_op_inputs())
    calls = [
        (aten._scaled_dot_product_efficient_attention, (q, k, v, bias, False)),
        (aten._scaled_dot_product_cudnn_attention, (q, k, v, bias, True)),
    ]
    for op, args in calls:
        with ed.EagerDecompMode("core_aten"):
            ours = op(*args)
        _assert_meta_like(ours, op(*args))


@pytest.mark.parametrize(
    "call",
    [
        lambda q, k, v, b: aten._scaled_dot_product_efficient_attention(q, k, v, b, True, 0.1),  # philox dropout
        lambda q, k, v, b: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True),  # causal, L != S
        lambda q, k, v, b: aten._scaled_dot_product_cudnn_attention(q, k, v, b, True, 0.1),
    ],
    ids=["efficient_dropout", "flash_causal_rect", "cudnn_dropout"],
)
def test_cuda_op_forms_without_a_defined_answer_are_declined(call):
    q, k, v, bias, _ = _cuda_op_inputs()
    with pytest.raises(ed.UnsupportedOpError, match="declined"), ed.EagerDecompMode("core_aten"):
        call(q, k, v, bias)


# -- a decoder-only model with grouped-query attention ------------------------------------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _batch(padded):
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    attention = torch.ones_like(ids)
    if padded:
        ids[0, :3], attention[0, :3] = 0, 0  # row 0 is left-padded: its pad queries see no key
    return ids, attention


# how transformers' SDPA integration runs grouped-query heads:
# "left_padded": a mask, so it repeats the key/value heads itself (decoding packs query heads);
# "left_padded_gqa": a mask with enable_gqa (forced), fully masked rows in the grouped kernel;
# "unpadded": no mask, enable_gqa and is_causal.
MODEL_CASES = {"left_padded": (True, False), "left_padded_gqa": (True, True), "unpadded": (False, False)}


def _model_case(case, monkeypatch):
    padded, force_gqa = MODEL_CASES[case]
    if force_gqa:
        monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        calls.append((query.shape[1], key.shape[1], kwargs.get("attn_mask") is not None))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return _batch(padded), calls


def _assert_grouped_when_expected(case, calls):
    grouped = any(hq > hkv for hq, hkv, _ in calls)
    assert grouped == (case != "left_padded"), calls
    assert any(masked for *_, masked in calls) == MODEL_CASES[case][0]


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_gqa_decoder_generates_like_native(case, monkeypatch):
    model = _tiny_llama().eval()
    (ids, attention), calls = _model_case(case, monkeypatch)
    kwargs = dict(max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    native = model.generate(input_ids=ids, attention_mask=attention, **kwargs)
    _assert_grouped_when_expected(case, calls)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        ours = model.generate(input_ids=ids, attention_mask=attention, **kwargs)
    rec.assert_only("core_aten")
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in {r.op for r in mode.report().decomposed}
    assert torch.equal(ours.sequences, native.sequences)
    for o, n in zip(ours.scores, native.scores):
        assert not o.isnan().any()
        torch.testing.assert_close(o, n)


@pytest.mark.parametrize("case", ["left_padded", "left_padded_gqa"])
def test_gqa_decoder_trains_like_native(case, monkeypatch):
    native = _tiny_llama().train()
    ours = copy.deepcopy(native)
    (ids, attention), calls = _model_case(case, monkeypatch)
    labels = ids.masked_fill(attention == 0, -100)

    def step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        return loss, grads

    loss_n, grads_n = step(native)
    _assert_grouped_when_expected(case, calls)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        loss_o, grads_o = step(ours)
    rec.assert_only("core_aten")
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in {
        r.op for r in mode.report().decomposed
    }
    torch.testing.assert_close(loss_o, loss_n)
    for o, n in zip(grads_o, grads_n):
        assert not o.isnan().any()
        torch.testing.assert_close(o, n, rtol=1e-4, atol=1e-6)
    for o, n, g in zip(ours.parameters(), native.parameters(), grads_n):
        # NOTE: Adam turns rounding noise in a gradient that is zero in exact arithmetic
        # into a full lr step; compare where the gradient carries signal (test_training.py)
        signal = g.abs() > 1e-4 * g.abs().max().clamp_min(1e-30)
        torch.testing.assert_close(o[signal], n[signal], rtol=1e-4, atol=1e-6)
