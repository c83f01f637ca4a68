"""A full training step (forward, backward, AdamW) under the mode matches native eager."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.testing import RecordingMode
from tests.compare import assert_params_close, train_like_eager


def _compare(model_cls, opset="core_aten", steps=2, witness=False):
    """``steps`` training steps of ``model_cls()`` natively and under ``EagerDecompMode(opset)``
    (tests/compare.py's train_like_eager), then the parameters after the optimizer's steps and the
    floating buffers (batch norm's running statistics) compared; returns ``(the last mode, its
    witness)``. The witness is off by default here: test_training_reaches_only_core_ops checks
    one step without the comparison's cost (tests/test_prims_fusion.py turns it on)."""
    native, ours, mode, grads, rec = train_like_eager(model_cls, opset, steps, witness=witness)
    assert_params_close(native, ours, grads)
    for b, c in zip(native.buffers(), ours.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5)
    return mode, rec


def test_transformer_block_trains_like_native():
    torch.manual_seed(0)
    block = lambda: TransformerBlock(dropout=0.0)  # noqa: E731
    block.batch = TransformerBlock.batch
    mode, _ = _compare(block)
    decomposed = {r.op for r in mode.report().decomposed}
    assert {"aten.gelu_backward.default", "aten.silu.default", "aten.addcdiv_.default"} <= decomposed


def test_small_cnn_trains_like_native():
    _compare(SmallCNN)


@pytest.mark.parametrize("model_cls", [TransformerBlock, SmallCNN])
def test_training_reaches_only_core_ops(model_cls):
    torch.manual_seed(0)
    model = model_cls()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = model_cls.batch()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        train_step(model, opt, x, y)
    rec.assert_only("core_aten")


def test_sdpa_flash_backward_decomposition_matches_native():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        expected = torch.autograd.grad(out.square().sum(), (q, k, v))
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
            out2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            got = torch.autograd.grad(out2.square().sum(), (q, k, v))
        rec.assert_only("core_aten")
        torch.testing.assert_close(out2, out)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    routes = {r.op: r.route for r in mode.report().rows}
    assert routes["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"] == "decomposed"
