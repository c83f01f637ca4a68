"""Real model families from ``transformers`` (tiny configs, random weights, offline): a training
step under the mode and on the reference device with the switch matches native eager.

Under the mode an independent ``RecordingMode`` entered outside it must see only core ATen; on
``edref`` the device has kernels for core ATen alone, so a step that runs there met nothing else.
The models marked ``slow`` run with ``make models`` (``EAGERDECOMP_MODELS=all``); ``make test``
runs a representative slice: RoPE + grouped-query attention, mixture of experts (histc and
_grouped_mm), CTC speech.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.errors import BackendError
from eagerdecomp.testing import RecordingMode, reference_device

T = pytest.importorskip("transformers")

try:
    DEV = reference_device()  # before any backward pass in this process (see refdev._check_autograd)
except BackendError:
    DEV = None

ALL = os.environ.get("EAGERDECOMP_MODELS", "").lower() == "all"
slow = pytest.mark.skipif(not ALL, reason="slow model: run with `make models` (EAGERDECOMP_MODELS=all)")


def _no_dropout(config):
    """Training mode without randomness: every dropout, layer drop and SpecAugment mask off."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("drop" in key or key.startswith("mask_") and key.endswith("_prob")):
            setattr(config, key, 0.0)
    return config


def _tokens(vocab, batch=2, length=8, low=0):
    return torch.randint(low, vocab, (batch, length))


def _lm_batch(vocab):
    def make():
        ids = _tokens(vocab)
        return dict(input_ids=ids, labels=ids)

    return make


def llama():  # decoder-only: RoPE, grouped-query attention (4 query heads, 2 key/value heads)
    cfg = T.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return T.LlamaForCausalLM(_no_dropout(cfg)), _lm_batch(64)


def qwen2_moe():  # mixture of experts, transformers' grouped experts path: histc and _grouped_mm
    cfg = T.Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        max_position_embeddings=64,
    )
    cfg._experts_implementation = "grouped_mm"
    return T.Qwen2MoeForCausalLM(_no_dropout(cfg)), _lm_batch(64)


def mixtral():  # mixture of experts, the per-expert loop (index_add_) and the router's load-balancing loss
    cfg = T.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        max_position_embeddings=64,
    )
    return T.MixtralForCausalLM(_no_dropout(cfg)), _lm_batch(64)


def mamba():  # state-space model (transformers' reference selective scan, no CUDA kernels)
    cfg = T.MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)
    return T.MambaForCausalLM(_no_dropout(cfg)), _lm_batch(64)


def bert():  # encoder
    cfg = T.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return T.BertForMaskedLM(_no_dropout(cfg)), _lm_batch(64)


def t5():  # encoder-decoder (relative position buckets)
    cfg = T.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0
    )
    return T.T5ForConditionalGeneration(_no_dropout(cfg)), lambda: dict(
        input_ids=_tokens(64), labels=_tokens(64, length=6, low=1)
    )


def _images(size, labels):
    return lambda: dict(pixel_values=torch.randn(2, 3, size, size), labels=labels())


def vit():  # vision transformer
    cfg = T.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    return T.ViTForImageClassification(_no_dropout(cfg)), _images(16, lambda: torch.tensor([0, 2]))


def resnet():  # CNN with batch norm (training mode: batch statistics, running stats updated)
    cfg = T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3)
    return T.ResNetForImageClassification(_no_dropout(cfg)), _images(32, lambda: torch.tensor([0, 2]))


def segformer():  # semantic segmentation (bilinear upsampling of the logits and its backward)
    cfg = T.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[8, 16],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=16,
        num_labels=3,
    )
    return T.SegformerForSemanticSegmentation(_no_dropout(cfg)), _images(32, lambda: torch.randint(0, 3, (2, 32, 32)))


def wav2vec2():  # speech with a CTC head: _ctc_loss, weight-normed positional convolution
    cfg = T.Wav2Vec2Config(
        vocab_size=12,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        ctc_loss_reduction="mean",
        feat_extract_norm="group",
    )
    batch = lambda: dict(input_values=torch.randn(2, 800), labels=torch.randint(1, 12, (2, 5)))  # noqa: E731
    return T.Wav2Vec2ForCTC(_no_dropout(cfg)), batch


FAST = [llama, qwen2_moe, wav2vec2]
SLOW = [mixtral, mamba, bert, t5, vit, resnet, segformer]
MODELS = [pytest.param(m, id=m.__name__) for m in FAST] + [
    pytest.param(m, id=m.__name__, marks=[pytest.mark.slow, slow]) for m in SLOW
]
# the device path of the fast slice: one model, the others under `make models`
DEVICE = [pytest.param(m, id=m.__name__, marks=[] if m is llama else [pytest.mark.slow, slow]) for m in FAST + SLOW]


def _build(builder):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, make_batch = builder()
    model.train()
    torch.manual_seed(1)
    return model, make_batch()


def _step(model, batch):
    """One training step's loss, parameter gradients and buffers (batch-norm statistics), on the CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = model(**batch).loss
        loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().cpu() for n, b in model.named_buffers() if b.is_floating_point()}
    return loss.detach().cpu(), grads, buffers


def _assert_matches(native, got):
    loss_n, grads_n, buf_n = native
    loss_g, grads_g, buf_g = got
    torch.testing.assert_close(loss_g, loss_n, rtol=1e-4, atol=1e-5)
    assert grads_g.keys() == grads_n.keys()
    for name in grads_n:
        torch.testing.assert_close(grads_g[name], grads_n[name], rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for name in buf_n:
        torch.testing.assert_close(buf_g[name], buf_n[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("builder", MODELS)
def test_training_step_under_the_mode(builder):
    model, batch = _build(builder)
    ours = copy.deepcopy(model)
    native = _step(model, batch)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = _step(ours, batch)
    rec.assert_only("core_aten")
    _assert_matches(native, got)


# make models FALLBACK=cpu: the device steps with the CPU tier on (on_unsupported="cpu")
FALLBACK = os.environ.get("EAGERDECOMP_MODELS_FALLBACK") or "error"


@pytest.fixture
def edref():
    if DEV is None:
        pytest.skip("reference device unavailable")
    ed.disable(DEV.type)
    switch = ed.enable(DEV.type, on_unsupported=FALLBACK)
    yield DEV
    on_cpu = [r.op for r in switch.report().rows if r.on_cpu]
    if on_cpu:  # the report names what the tier ran (pytest -rP shows it)
        print(f"CPU tier: {', '.join(on_cpu)}")
    ed.disable(DEV.type)


@pytest.mark.parametrize("builder", DEVICE)
def test_training_step_on_the_reference_device(edref, builder):
    model, batch = _build(builder)
    ours = copy.deepcopy(model).to(edref)
    # NOTE: Module.to() onto edref replaces each module's parameters separately, which unties
    # tied weights (embeddings and LM head); transformers re-ties them on request
    ours.tie_weights()
    native = _step(model, batch)
    got = _step(ours, {k: v.to(edref) for k, v in batch.items()})
    _assert_matches(native, got)


def test_moe_model_reaches_the_new_fills():
    # the fast slice's MoE model must exercise what it stands for, not a path around it
    model, batch = _build(qwen2_moe)
    with ed.EagerDecompMode("core_aten") as mode:
        _step(model, batch)
    decomposed = {r.op for r in mode.report().decomposed}
    assert {"aten.histc.default", "aten._grouped_mm.default"} <= decomposed
