"""The prims_fusion preset: prims plus the library ops a fusion compiler keeps.

Real training steps run under it and match native, with an independent witness
(RecordingMode, entered outside the mode) checking that only the preset's ops reached the
kernels below; and the decompositions it needed beyond PyTorch's are checked against eager.
"""

import contextlib
import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.demo import SmallCNN, TransformerBlock, train_step
from eagerdecomp.ops.opset import PRIMS_LIBRARY_OPS, RUNTIME_EXTRAS
from eagerdecomp.testing import RecordingMode
from tests.test_training import _compare

aten = torch.ops.aten
PRESET = "prims_fusion"


def test_preset_is_prims_plus_its_library_ops():
    prims, fusion = ed.OpSet.preset("prims"), ed.OpSet.preset(PRESET)
    assert fusion == prims | list(PRIMS_LIBRARY_OPS)
    assert fusion.name == PRESET and PRESET in ed.PRESETS
    # pure prims stays strict PrimTorch: no aten compute op beyond the runtime's own
    assert {op for op in prims if op.namespace == "aten"} == set(RUNTIME_EXTRAS) | {
        aten._local_scalar_dense.default,
        aten.resize_.default,
    }
    assert not set(PRIMS_LIBRARY_OPS) & set(prims)
    assert len(PRIMS_LIBRARY_OPS) <= 25
    for op, reason in PRIMS_LIBRARY_OPS.items():
        assert op.namespace == "aten" and len(reason) > 20, op


def _native_ops(model_cls) -> set:
    # what the same step calls natively (recorded the same way): the witness below must see
    # fewer aten ops, so it really sits under the mode's decompositions
    torch.manual_seed(0)
    model = model_cls()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with RecordingMode() as rec:
        train_step(model, opt, *model_cls.batch())
    return set(rec.ops)


def _block():
    return TransformerBlock(dropout=0.0)  # dropout draws from another order of the stream


_block.batch = TransformerBlock.batch


@pytest.mark.parametrize("model_cls", [_block, SmallCNN], ids=["transformer", "cnn"])
def test_demo_models_train_like_native_reaching_only_the_preset(model_cls):
    mode, rec = _compare(model_cls, PRESET, witness=True)  # test_training's comparison, under the preset
    assert any(op.namespace == "prims" for op in rec.ops)  # a prims program reached the kernels
    assert _native_ops(model_cls) - set(rec.ops)  # (and not the native one)
    passed = {r.op for r in mode.report().rows if r.route == "passthrough"}
    assert passed <= {str(op) for op in ed.OpSet.preset(PRESET)} | {
        "profiler._record_function_enter_new.default",
        "profiler._record_function_exit._RecordFunction",
    }


def test_bert_trains_like_native_reaching_only_the_preset():
    pytest.importorskip("transformers")
    from eagerdecomp.workloads import bert, bert_batches, bert_step

    native = bert()
    ours = copy.deepcopy(native)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    (batch,) = bert_batches([12])
    loss_n = bert_step(native, opt_n, batch)
    with RecordingMode() as rec, ed.EagerDecompMode(PRESET):
        loss_o = bert_step(ours, opt_o, batch)
    rec.assert_only(PRESET)
    torch.testing.assert_close(loss_o, loss_n, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(native.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=2e-5, msg=name)


@pytest.mark.parametrize(
    "shape, size", [((2, 8, 5, 5), 2), ((2, 3, 7, 9), (3, 4)), ((4, 5, 6), (4, 4)), ((1, 2, 5, 7), (4, 3))]
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_avg_pool2d_backward_matches_eager(shape, size, channels_last):
    x = torch.randn(shape, dtype=torch.float64)
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = F.adaptive_avg_pool2d(x, size)
    g = torch.randn_like(y)
    (want,) = torch.autograd.grad(y, x, g)
    with RecordingMode() as rec, ed.EagerDecompMode(PRESET) as mode:
        (got,) = torch.autograd.grad(F.adaptive_avg_pool2d(x, size), x, g)
    rec.assert_only(PRESET)
    routes = {r.op: r.route for r in mode.report().rows}
    assert routes["aten._adaptive_avg_pool2d_backward.default"] == "decomposed"
    assert got.stride() == want.stride()
    if channels_last and x.dim() == 4:  # eager's channels-last kernel sums in another order
        torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-15)
    else:  # the same shares added in the same order
        assert torch.equal(got, want)


@pytest.mark.parametrize("opset", ["core_aten", PRESET])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_exp2_and_pow_of_two_match_eager(opset, dtype):
    x = torch.arange(-6, 7, dtype=dtype)
    if dtype.is_floating_point:
        x = x / 3
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = torch.exp2(x), torch.pow(2, x), torch.pow(2.0, x)
    rec.assert_only(opset)
    for a, b in zip(got, (torch.exp2(x), torch.pow(2, x), torch.pow(2.0, x))):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("opset", ["prims", PRESET])
def test_select_to_a_0_dim_view(opset):
    # x[0] of a vector (nn.GRU's batch_sizes[0] on packed input, a storage's tolist()) is a 0-dim view
    base = torch.arange(8.0)
    x = base[2:]
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = x[0], x.select(0, -1), base.untyped_storage().tolist()
        got[0].add_(100)  # a view: the write lands in the base
    rec.assert_only(opset)
    want_base = torch.arange(8.0)
    want = want_base[2:][0], want_base[2:].select(0, -1), want_base.untyped_storage().tolist()
    want[0].add_(100)
    for a, b in zip(got[:2], want[:2]):
        assert (a.shape, a.stride(), a.storage_offset(), a._base is x._base) == (
            b.shape,
            b.stride(),
            b.storage_offset(),
            True,
        )
        assert torch.equal(a, b)
    assert got[2] == want[2] and torch.equal(base, want_base)


@pytest.mark.parametrize("opset", ["prims", PRESET])
def test_select_of_conjugated_and_negated_views(opset):
    # select decomposes to prims.as_strided, whose schema says it writes its input: PyTorch's
    # math-bit fallback then failed an internal assert on x.conj().imag[0] (a negated view) and
    # measured the imaginary part's storage in the view's dtype (x.conj().imag[:, 2] "out of bounds")
    x = torch.randn(4, 5, dtype=torch.complex64)
    # made outside the mode, which has no path for _conj and view_as_real (a device keeps the latter)
    c, neg, imag = x.conj(), x.conj().imag, x.imag
    assert neg.is_neg()
    calls = [lambda: neg[1], lambda: neg[:, 2], lambda: neg.select(1, -1), lambda: c[2], lambda: imag[3]]
    for call, witness in itertools.product(calls, (True, False)):
        want = call()
        # (a Python mode outside sends the mode down its Python path: the fault was on the other)
        with RecordingMode() if witness else contextlib.nullcontext() as rec, ed.EagerDecompMode(opset):
            got = call()
        if witness:
            rec.assert_only(opset)
        meta = lambda t: (t.shape, t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())  # noqa: E731
        assert meta(got) == meta(want)
        assert want._base is x and got._base is x  # a view of x, as eager's
        assert torch.equal(got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg())


def _outcome(call):
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - the error is the result compared
        return e


@pytest.mark.parametrize("opset", ["prims", PRESET])
def test_views_and_their_errors_are_eagers(opset):
    # found by PyTorch's test_view_ops.py on edprims: view(dtype) read the dtype as a shape
    # (TypeError), expand's mismatch had other words, view's incompatible strides a ValueError
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    t = torch.rand(4, 2, 5, 1, 6, 2, 9, 3).transpose(-1, 2).transpose(-2, 3)
    one = torch.randn(1, 3)
    calls = [
        lambda: x.view(torch.int32),
        lambda: x.view(torch.int16),
        lambda: x.view(torch.float64),
        lambda: x.t().view(torch.int16),  # eager's error: the last stride must be 1
        lambda: x[:, 1:].view(torch.float64),  # eager's error: the last size must divide
        lambda: x.expand(3, 1),
        lambda: x.expand(2),
        lambda: x.expand(-1, 3, 4),
        lambda: x.expand(2, -1, -1),
        lambda: torch.broadcast_to(x, (4, 1, 1)),
        lambda: one.expand(2, -1, 3),
        lambda: t.view(8, 1, 3, 3, 3, 4, 1, 3, 5),
        lambda: t.view(-1),
        lambda: x.view(7, -1),
        lambda: torch.empty(0).view(-1, 0),
    ]
    for i, call in enumerate(calls):
        want = _outcome(call)
        with RecordingMode() as rec, ed.EagerDecompMode(opset):
            got = _outcome(call)
        if isinstance(want, Exception):
            assert (type(got), str(got)) == (type(want), str(want)), i
            continue
        rec.assert_only(opset)
        assert isinstance(got, torch.Tensor), (i, got)
        meta = lambda t: (t.dtype, t.shape, t.stride(), t.storage_offset(), t.untyped_storage().data_ptr())  # noqa: E731
        assert meta(got) == meta(want) and torch.equal(got, want), i


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8, torch.bool, torch.float32])
@pytest.mark.parametrize("value", [-100, -100.0, 2.5, -2.5, 300.0, float("nan")])
def test_pad_converts_its_value_as_eager(dtype, value):
    # F.pad passes its value as a float: the prims ref refused -100.0 for int64 labels, and a
    # causal-LM loss (transformers pads its labels with -100) failed under the preset; the zoo's
    # retry without labels then hid it as a mismatch
    x = torch.arange(6).view(2, 3).to(dtype)
    want = _outcome(lambda: F.pad(x, (0, 1, 1, 0), value=value))
    with RecordingMode() as rec, ed.EagerDecompMode(PRESET):
        got = _outcome(lambda: F.pad(x, (0, 1, 1, 0), value=value))
    if isinstance(want, Exception):
        assert (type(got), str(got)) == (type(want), str(want))
        return
    rec.assert_only(PRESET)
    assert got.dtype == want.dtype and got.stride() == want.stride()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_causal_lm_loss_like_eager():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))

    def loss():  # transformers' ForCausalLMLoss
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.float().view(-1, 11), shifted.view(-1), ignore_index=-100)

    with RecordingMode() as rec, ed.EagerDecompMode(PRESET):
        got = loss()
    rec.assert_only(PRESET)
    torch.testing.assert_close(got, loss(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.float64])
def test_geometric_and_exponential_in_place_draw_eagers_numbers(dtype):
    # torch's in-place refs came first in a prims table: another stream, and an integer
    # geometric_ on edprims was refused by the uniform_ kernel filling it (test_torch's test_geometric)
    calls = [lambda t: t.geometric_(0.3)]
    if dtype.is_floating_point:
        calls.append(lambda t: t.exponential_(2.0))
    for call in calls:
        torch.manual_seed(3)
        want = call(torch.empty(5, 7, dtype=dtype))
        torch.manual_seed(3)
        with RecordingMode() as rec, ed.EagerDecompMode(PRESET):
            got = call(torch.empty(5, 7, dtype=dtype))
        rec.assert_only(PRESET)
        # (float64 exponential_: eager's numbers but for log1p's last bit, decompositions/rng.py)
        torch.testing.assert_close(got, want, rtol=1e-15 if dtype == torch.float64 else 0, atol=0)


@pytest.mark.parametrize("name", ["gt_", "ne_", "eq_", "pow_", "atan2_", "add_", "mul_"])
def test_in_place_op_refuses_a_self_too_small_for_the_broadcast(name):
    # torch's in-place refs resized self to the broadcast shape (with a deprecation warning)
    # where eager raises: small.gt_(large) became [4, 3] under the preset
    small, large = torch.randn(1, 3), torch.randn(4, 3)
    with pytest.raises(RuntimeError) as want:
        getattr(small.clone(), name)(large)
    mine = small.clone()
    with ed.EagerDecompMode(PRESET), pytest.raises(RuntimeError, match=r"doesn't match the broadcast shape"):
        getattr(mine, name)(large)
    assert "broadcast shape" in str(want.value) and mine.shape == small.shape and torch.equal(mine, small)
    # the broadcast the other way is eager's
    big = large.clone()
    with RecordingMode() as rec, ed.EagerDecompMode(PRESET):
        got = getattr(big, name)(small)
    rec.assert_only(PRESET)
    want_big = getattr(large.clone(), name)(small)
    assert got is big and torch.equal(got.nan_to_num(), want_big.nan_to_num()) and got.dtype == want_big.dtype


@pytest.mark.parametrize("opset", ["core_aten", PRESET])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_exponential_of_an_infinite_rate_is_eagers_zeros(opset, dtype):
    # the decomposition declined lambd=inf ("no path"), where eager draws -1/inf * log1p(-u): zeros
    # (test_torch's test_exponential on edref and edprims)
    torch.manual_seed(0)
    want = torch.empty(9, dtype=dtype).exponential_(float("inf"))
    torch.manual_seed(0)
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = torch.empty(9, dtype=dtype).exponential_(float("inf"))
    rec.assert_only(opset)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
