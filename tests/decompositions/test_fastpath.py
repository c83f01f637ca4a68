"""The transformer fast path (eagerdecomp/fastpath.py) against native eager.

``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder`` and ``nn.MultiheadAttention`` in
eval mode under ``no_grad`` call ``_transformer_encoder_layer_fwd`` and
``_native_multi_head_attention``; under the mode they must decompose (every test checks
the route, so a model that left the fast path would not pass for it) into core ops only
(an independent ``RecordingMode`` outside the mode) and give eager's values, dtypes,
shapes and strides, NaN where eager's masked softmax leaves a fully masked row NaN.
"""

import copy

import pytest
import torch
import torch.nn as nn

import eagerdecomp as ed
from eagerdecomp.device.switch import enabled
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten
FLOATS = [torch.float32, torch.float64]
B, T = 3, 6


def _assert_like_native(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        assert torch.equal(g.isnan(), w.isnan())  # eager's NaN rows, and only those
        torch.testing.assert_close(g, w, equal_nan=True)


def _under_mode(fn, *ops):
    """``fn()`` under the mode, checked to reach the kernels below as core ops only and to
    decompose ``ops`` (the fast path was taken)."""
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        out = fn()
    rec.assert_only("core_aten")
    routes = {r.op: r.route for r in mode.report().rows}
    for op in ops:
        assert routes.get(str(op)) == "decomposed", routes
    return out


def _masks(form, dtype=torch.bool):
    """(key padding mask [B, T], attention mask [T, T]) of a form; True drops a key."""
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, 4:] = True
    if form == "full_row":
        padding[2, :] = True  # every key of batch element 2 dropped: eager's fast path gives NaN
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    pad = padding if form in ("padding", "full_row", "both") else None
    attn = causal if form in ("attn", "both") else None
    if dtype != torch.bool:  # the modules' float masks: -inf drops, 0 keeps
        pad, attn = (
            None if m is None else torch.zeros(m.shape, dtype=dtype).masked_fill(m, -torch.inf) for m in (pad, attn)
        )
    return pad, attn


MASK_FORMS = ["none", "padding", "full_row", "attn", "both"]
ENCODER = aten._transformer_encoder_layer_fwd.default
MHA = aten._native_multi_head_attention.default
TBRQ = aten._transform_bias_rescale_qkv.default


# -- nn.TransformerEncoderLayer ----------------------------------------------------------


# every combination in float32; in float64 both layer orders, each with one activation
ENCODER_CASES = [
    *(
        (torch.float32, norm_first, activation, form)
        for norm_first in (False, True)
        for activation in ("relu", "gelu")
        for form in MASK_FORMS
    ),
    *(
        (torch.float64, norm_first, activation, form)
        for norm_first, activation in ((False, "gelu"), (True, "relu"))
        for form in ("none", "full_row", "both")
    ),
]


@pytest.mark.parametrize("dtype, norm_first, activation, form", ENCODER_CASES, ids=str)
def test_encoder_layer_matches_native(dtype, norm_first, activation, form):
    torch.manual_seed(0)
    # head size 8 (q's scale 1/sqrt(8) rounds) without norm_first, 4 (an exact 1/2) with it
    d, heads = (32, 4) if not norm_first else (16, 4)
    layer = nn.TransformerEncoderLayer(
        d, heads, 2 * d, dropout=0.0, activation=activation, norm_first=norm_first, batch_first=True, dtype=dtype
    ).eval()
    x = torch.randn(B, T, d, dtype=dtype)
    pad, attn = _masks(form, dtype if form == "both" else torch.bool)
    with torch.no_grad():
        want = layer(x, src_mask=attn, src_key_padding_mask=pad)
        got = _under_mode(lambda: layer(x, src_mask=attn, src_key_padding_mask=pad), ENCODER)
    assert want[2].isnan().all() == (form == "full_row")
    _assert_like_native(got, want)


def test_encoder_stack_over_several_lengths():
    # nn.TransformerEncoder calls the op once per layer; lengths that differ replay the
    # op's kernel at other shapes
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, activation="gelu")
    encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    inputs = []
    for b, t in ((2, 5), (3, 9), (1, 4)):
        padding = torch.zeros(b, t, dtype=torch.bool)
        padding[0, t // 2 :] = True
        inputs.append((torch.randn(b, t, 16), padding))
    with torch.no_grad():
        want = [encoder(x, src_key_padding_mask=p) for x, p in inputs]
        got = _under_mode(lambda: [encoder(x, src_key_padding_mask=p) for x, p in inputs], ENCODER)
    for g, w in zip(got, want):
        _assert_like_native(g, w)


# -- nn.MultiheadAttention ---------------------------------------------------------------


# every combination in float32; in float64 each mask form once
MHA_CASES = [
    *(
        (torch.float32, need_weights, average, form)
        for need_weights in (True, False)
        for average in (True, False)
        for form in MASK_FORMS
    ),
    *((torch.float64, i % 3 != 2, i % 2 == 0, form) for i, form in enumerate(MASK_FORMS)),
]


@pytest.mark.parametrize("dtype, need_weights, average, form", MHA_CASES, ids=str)
def test_multihead_attention_matches_native(dtype, need_weights, average, form):
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(16, 4, batch_first=True, dtype=dtype).eval()
    x = torch.randn(B, T, 16, dtype=dtype)
    pad, attn = _masks(form)
    kwargs = dict(key_padding_mask=pad, attn_mask=attn, need_weights=need_weights, average_attn_weights=average)
    with torch.no_grad():
        want = mha(x, x, x, **kwargs)
        got = _under_mode(lambda: mha(x, x, x, **kwargs), MHA)
    if need_weights:
        assert want[1].shape == ((B, T, T) if average else (B, 4, T, T))
    else:
        assert want[1] is None
    _assert_like_native(got, want)


# -- the ops themselves: mask types, cross-attention, the helpers ------------------------


def _mha_args(dtype, d=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    x, y, z = (torch.randn(B, T, d, generator=g).to(dtype) for _ in range(3))
    weights = (
        (torch.randn(3 * d, d, generator=g) * 0.3).to(dtype),
        torch.randn(3 * d, generator=g).to(dtype),
        (torch.randn(d, d, generator=g) * 0.3).to(dtype),
        torch.randn(d, generator=g).to(dtype),
    )
    return (x, y, z), weights


def _op_masks(dtype):
    """(mask, mask_type) the op accepts: bool and float (any nonzero drops: 0.5, NaN, -inf)."""
    g = torch.Generator().manual_seed(4)
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[0, 1::2] = True
    padding[2, :] = True
    src = torch.ones(T, T, dtype=torch.bool).triu(1)
    generic = torch.rand(B, 2, T, T, generator=g) > 0.6
    weird = torch.zeros(B, T, dtype=dtype)
    weird[0, 1], weird[1, 2], weird[1, 4] = 0.5, torch.nan, -torch.inf
    return [
        (None, None),
        (src, 0),
        (padding, 1),
        (weird, 1),
        (generic, 2),
        (generic, None),
        (src.expand(B, 2, T, T), 0),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_native_multi_head_attention_op(dtype):
    (x, y, z), weights = _mha_args(dtype)
    inputs = [(x, x, x), (x, y, y), (x, y, z)]  # self-attention, one key/value tensor, three
    returns = [(True, True), (True, False), (False, True)]  # weights averaged, per head, none
    for i, (mask, mask_type) in enumerate(_op_masks(dtype)):
        (q, k, v), (need_weights, average) = inputs[i % 3], returns[(i // 3 + i) % 3]
        args = (q, k, v, 16, 2, *weights, mask, need_weights, average, mask_type)
        want = aten._native_multi_head_attention(*args)
        got = _under_mode(lambda: aten._native_multi_head_attention(*args), MHA)
        _assert_like_native(got, want)


def test_transform_bias_rescale_qkv_op():
    for dtype in (*FLOATS, torch.bfloat16, torch.float16):
        for heads, d in ((4, 16), (2, 16), (3, 24), (1, 8)):
            g = torch.Generator().manual_seed(5)
            qkv, bias = torch.randn(B, T, 3 * d, generator=g).to(dtype), torch.randn(3 * d, generator=g).to(dtype)
            for t in (qkv, qkv.transpose(0, 1).contiguous().transpose(0, 1)):  # and a permuted qkv
                want = aten._transform_bias_rescale_qkv(t, bias, heads)
                got = _under_mode(lambda: aten._transform_bias_rescale_qkv(t, bias, heads), TBRQ)
                # q scaled by the kernel's own constant: equal, not merely close
                for w, o in zip(want, got):
                    layout = (o.dtype, o.shape, o.stride(), o.storage_offset())
                    assert layout == (w.dtype, w.shape, w.stride(), w.storage_offset())
                    assert torch.equal(o, w), (dtype, heads, d)
                # three views of one buffer, as the kernel's
                assert len({o.untyped_storage().data_ptr() for o in got}) == 1


def test_masked_softmax_op():
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(B, 2, T, T, generator=g)
    padding = torch.rand(B, T, generator=g) > 0.5
    padding[1] = True
    src = torch.rand(T, T, generator=g) > 0.5
    generic = torch.rand(B, 2, T, T, generator=g) > 0.5
    cases = [
        (scores, padding, 3, 1),
        (scores, padding, None, 1),
        (scores, padding, 2, 1),
        (scores, src, -1, 0),
        (scores, src, 1, 0),
        (scores, generic, 0, 2),
        (scores, generic, None, None),
        (torch.randn(4, 7, generator=g), torch.rand(4, 7, generator=g) > 0.5, 0, None),  # any rank: type 2
        (torch.randn(B, 2, T, 2 * T, generator=g)[..., ::2], padding, 3, 1),  # strided, not permuted
        (torch.tensor(2.0), torch.tensor(True), None, None),
        (torch.randn(0, 3), torch.zeros(0, 3, dtype=torch.bool), 1, 2),
    ]
    for dtype in (*FLOATS, torch.bfloat16, torch.float16):
        for x, mask, dim, mask_type in cases:
            x = x.to(dtype)
            want = aten._masked_softmax(x, mask, dim, mask_type)
            got = _under_mode(lambda: aten._masked_softmax(x, mask, dim, mask_type), aten._masked_softmax.default)
            _assert_like_native(got, want)


# -- errors and refusals -----------------------------------------------------------------


def _error_calls():
    (x, y, _), (w, b, pw, pb) = _mha_args(torch.float32)
    square = torch.zeros(T, T, dtype=torch.bool)
    return {
        "2-D mask without a type": lambda: aten._native_multi_head_attention(x, x, x, 16, 2, w, b, pw, pb, square),
        "unknown mask type": lambda: aten._native_multi_head_attention(
            x, x, x, 16, 2, w, b, pw, pb, square, True, True, 7
        ),
        "type 2 mask of another shape": lambda: aten._native_multi_head_attention(
            x, x, x, 16, 2, w, b, pw, pb, square.view(1, 1, T, T), True, True, 2
        ),
        "heads do not divide": lambda: aten._native_multi_head_attention(x, x, x, 16, 3, w, b, pw, pb),
        "embed_dim is not query's": lambda: aten._native_multi_head_attention(x, x, x, 8, 2, w, b, pw, pb),
        "key of another shape": lambda: aten._native_multi_head_attention(x, y[:, :2], y[:, :2], 16, 2, w, b, pw, pb),
        "float mask to the softmax": lambda: aten._masked_softmax(torch.randn(2, 3), torch.zeros(2, 3), 1, 2),
        "integer scores": lambda: aten._masked_softmax(torch.ones(2, 3, dtype=torch.long), square[:2, :3], 1, 2),
    }


@pytest.mark.parametrize("name", list(_error_calls()))
def test_errors_are_eagers(name):
    call = _error_calls()[name]
    with pytest.raises(Exception) as native:
        call()
    with ed.EagerDecompMode("core_aten"), pytest.raises(Exception) as ours:
        call()
    assert type(ours.value) is type(native.value), (ours.value, native.value)


def _declined_calls():
    permuted = torch.randn(B, 2, T, T).transpose(2, 3)
    return {
        # eager fills an output laid out as the input in contiguous order
        "permuted scores": (
            lambda: aten._masked_softmax(permuted, torch.zeros(permuted.shape, dtype=torch.bool), 3, 2),
            "aten._masked_softmax.default",
        ),
        # eager reads a [B, L] mask with rows of S != L keys
        "padding mask, L != S": (
            lambda: aten._masked_softmax(torch.randn(B, 2, T, T + 1), torch.zeros(B, T, dtype=torch.bool), 3, 1),
            "aten._masked_softmax.default",
        ),
        # eager reads a float64 bias of float32 qkv as float32
        "bias of another dtype": (
            lambda: aten._transform_bias_rescale_qkv(torch.randn(B, T, 48), torch.randn(48, dtype=torch.float64), 4),
            "aten._transform_bias_rescale_qkv.default",
        ),
    }


def test_a_permuted_src_gives_eagers_contiguous_result():
    # the meta kernel keeps a permuted src's layout; eager's (and ours) is contiguous
    x = torch.randn(T, B, 16).transpose(0, 1)  # batch first, laid out sequence first
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    with torch.no_grad():
        want = layer(x)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = layer(x)
    rec.assert_only("core_aten")
    assert got.stride() == want.stride() == torch.empty(want.shape).stride()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", list(_declined_calls()))
def test_declined_calls_say_so(name):
    call, op = _declined_calls()[name]
    with torch.no_grad(), ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError) as e:
        call()
    assert op in str(e.value) and "declined" in str(e.value)


# -- on a device -------------------------------------------------------------------------


def test_on_the_reference_device(switched_device):
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    on_device = [copy.deepcopy(m).to(switched_device) for m in (encoder, mha)]
    x = torch.randn(B, T, 16)
    pad, _ = _masks("padding")
    xd, padd = x.to(switched_device), pad.to(switched_device)
    with torch.no_grad():
        want = (encoder(x, src_key_padding_mask=pad), *mha(x, x, x, key_padding_mask=pad))
        got = (on_device[0](xd, src_key_padding_mask=padd), *on_device[1](xd, xd, xd, key_padding_mask=padd))
    assert all(g.device == xd.device for g in got)
    _assert_like_native([g.cpu() for g in got], want)
    report = enabled(switched_device).report()
    routes = {r.op: r.route for r in report.rows}
    assert routes[str(ENCODER)] == "decomposed" and routes[str(MHA)] == "decomposed"
    assert not report.by_route("unsupported")
