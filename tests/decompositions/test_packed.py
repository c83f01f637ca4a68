"""Packed sequences under the mode (eagerdecomp/decompositions/packed.py): pack_padded_sequence
into nn.LSTM / nn.GRU, forward and backward, and pad_packed_sequence back, against native eager,
with an independent witness; lengths are data, so each call packs by its own lengths."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten

# NOTE: a packed input never takes oneDNN's path (only padded nn.LSTM input does, docs/limits.md),
# so these run with PyTorch's defaults
PRESETS = ["core_aten", "prims_fusion"]
LAYERS = {
    "lstm 2 layers bidirectional": lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True),
    "lstm projections": lambda: nn.LSTM(4, 5, proj_size=3, batch_first=True),
    "gru": lambda: nn.GRU(4, 5, batch_first=True),
    "gru bidirectional": lambda: nn.GRU(4, 5, bidirectional=True, batch_first=True),
}


def _step(model, x, lengths, enforce_sorted=True):
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=enforce_sorted)
    out, state = model(packed)
    padded, out_lengths = pad_packed_sequence(out, batch_first=True, padding_value=-1.0)
    hidden = state[0] if isinstance(state, tuple) else state
    (padded.square().sum() + hidden.sum()).backward()
    return [packed.data, packed.batch_sizes, padded, out_lengths, hidden, x.grad] + [p.grad for p in model.parameters()]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride(), g.device) == (w.dtype, w.shape, w.stride(), w.device)
        torch.testing.assert_close(g, w)


def _run(preset, name, lengths, enforce_sorted=True, seed=0):
    torch.manual_seed(seed)
    model = LAYERS[name]()
    ours = copy.deepcopy(model)
    x = torch.randn(len(lengths), 6, 4)
    want = _step(model, x.clone().requires_grad_(), torch.tensor(lengths), enforce_sorted)
    with RecordingMode() as rec, ed.EagerDecompMode(preset) as mode:
        got = _step(ours, x.clone().requires_grad_(), torch.tensor(lengths), enforce_sorted)
    rec.assert_only(preset)
    assert_same(got, want)
    return mode


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(LAYERS))
def test_packed_sequences_train_as_native(preset, name):
    mode = _run(preset, name, [6, 4, 4, 1])
    assert mode.report().row(aten._pack_padded_sequence.default).calls == 1


@pytest.mark.parametrize("preset", PRESETS)
def test_unsorted_lengths_with_enforce_sorted_false(preset):
    _run(preset, "gru", [2, 6, 3, 6], enforce_sorted=False)


def test_each_call_packs_by_its_own_lengths():
    # the same shapes with other lengths: a kernel traced for the first would pack the second wrongly
    with ed.EagerDecompMode("core_aten") as mode:
        for lengths in ([6, 4, 2], [5, 5, 1], [6, 6, 6]):
            x = torch.randn(3, 6, 4)
            got = aten._pack_padded_sequence.default(x, torch.tensor(lengths), True)
            with torch.utils._python_dispatch._disable_current_modes():
                want = aten._pack_padded_sequence.default(x, torch.tensor(lengths), True)
            assert_same(list(got), list(want))
    assert mode.report().row(aten._pack_padded_sequence.default).route == "bypassed"


@pytest.mark.parametrize(
    "x,lengths",
    [
        (torch.randn(3, 6, 4), torch.tensor([6, 4, 2], dtype=torch.int32)),  # not int64
        (torch.randn(3, 6, 4), torch.tensor([[6, 4, 2]])),  # not 1-d
        (torch.randn(3, 6, 4), torch.tensor([6, 4])),  # not one per sequence
        (torch.randn(3, 6, 4), torch.tensor([6, 4, 0])),  # an empty sequence
        (torch.randn(3, 6, 4), torch.tensor([4, 6, 2])),  # unsorted
        (torch.randn(0, 6, 4), torch.tensor([6, 4, 2])),  # nothing to pack
    ],
    ids=["int32", "2d", "count", "zero", "unsorted", "empty"],
)
def test_bad_lengths_raise_eagers_error(x, lengths):
    op = aten._pack_padded_sequence.default
    with pytest.raises(RuntimeError) as native:
        op(x, lengths, True)
    with pytest.raises(RuntimeError) as ours, ed.EagerDecompMode("core_aten"):
        op(x, lengths, True)
    assert type(ours.value) is type(native.value) and str(ours.value) == str(native.value)


def test_lengths_longer_than_the_input_pack_as_eager():
    # eager's slices clamp at the input's end while batch_sizes counts every step of lengths[0]
    x, lengths = torch.randn(7, 2, 3), torch.tensor([8, 3])
    want = aten._pack_padded_sequence.default(x, lengths, False)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = aten._pack_padded_sequence.default(x, lengths, False)
    rec.assert_only("core_aten")
    assert_same(list(got), list(want))


def test_packed_lstm_on_the_device_with_cpu_lengths(switched_device):
    dev = switched_device
    torch.manual_seed(0)
    model = LAYERS["lstm 2 layers bidirectional"]()
    ours = copy.deepcopy(model).to(dev)
    x, lengths = torch.randn(3, 6, 4), [6, 3, 3]
    want = _step(model, x.clone().requires_grad_(), torch.tensor(lengths))
    got = _step(ours, x.to(dev).requires_grad_(), torch.tensor(lengths))  # lengths on the CPU, as eager asks
    assert got[0].device == dev and got[1].device.type == "cpu"
    assert_same([t.cpu() for t in got], want)
    assert ed.device.enabled(dev).report().row(aten._pack_padded_sequence.default).calls == 1
