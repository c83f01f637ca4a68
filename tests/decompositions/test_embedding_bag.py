"""EmbeddingBag's forward-only twin and gradients (eagerdecomp/embedding_bag.py) against eager."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten
OFFSETS = ([0, 4, 4], [0, 3, 5, 8], [0, 2, 8], [0])
INDICES = [1, 2, 4, 5, 4, 3, 2, 4]


def _mode():
    return ed.EagerDecompMode("core_aten")


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_forward_only(index_dtype):
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(10, 3, generator=g)
    indices = torch.tensor(INDICES, dtype=index_dtype)
    for offsets in OFFSETS:
        offsets = torch.tensor(offsets, dtype=index_dtype)
        for mode in (0, 1, 2):
            for psw in (None, torch.rand(8, generator=g)) if mode == 0 else (None,):
                for last in (False, True):
                    for pad in (-1, 4):
                        args = (weight, indices, offsets, False, mode, False, psw, last, pad)
                        if last:  # declined: see the NOTE on the fill
                            with _mode(), pytest.raises(ed.UnsupportedOpError):
                                aten._embedding_bag_forward_only(*args)
                            continue
                        want = aten._embedding_bag_forward_only(*args)
                        with RecordingMode() as rec, _mode():
                            got = aten._embedding_bag_forward_only(*args)
                        rec.assert_only("core_aten")
                        for w, o in zip(want, got):
                            assert (o.dtype, o.shape, o.stride()) == (w.dtype, w.shape, w.stride()) and torch.equal(
                                w, o
                            )


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_gradients_match_autograd_of_the_native_op(mode, dtype):
    g = torch.Generator().manual_seed(4)
    indices = torch.tensor(INDICES)
    for offsets in OFFSETS:
        offsets = torch.tensor(offsets)
        for freq in (False, True):
            for pad in (None, 4):
                for last in (False, True):
                    if (mode == "max" and freq) or (last and offsets.numel() == 1):
                        continue  # eager refuses the first; the second (no bags) crashes eager's backward
                    if last and dtype == torch.float32 and mode == "sum" and pad is None and offsets[-1] < len(INDICES):
                        continue  # eager's backward reads past its gradient here: see the NOTE on _offset2bag
                    for weighted in (False, True) if mode == "sum" else (False,):
                        weight = torch.randn(10, 3, generator=g, dtype=dtype, requires_grad=True)
                        psw = torch.rand(8, generator=g, dtype=dtype, requires_grad=True) if weighted else None
                        kwargs = dict(
                            mode=mode,
                            scale_grad_by_freq=freq,
                            padding_idx=pad,
                            include_last_offset=last,
                            per_sample_weights=psw,
                        )
                        up = torch.randn(
                            F.embedding_bag(indices, weight, offsets, **kwargs).shape, generator=g, dtype=dtype
                        )
                        leaves = [weight] + ([psw] if weighted else [])
                        want = torch.autograd.grad(F.embedding_bag(indices, weight, offsets, **kwargs), leaves, up)
                        with RecordingMode() as rec, _mode():
                            got = torch.autograd.grad(F.embedding_bag(indices, weight, offsets, **kwargs), leaves, up)
                        rec.assert_only("core_aten")
                        for w, o in zip(want, got):
                            torch.testing.assert_close(o, w)


def test_scale_grad_by_freq_keeps_the_kernels_lookup():
    # the kernel divides group g of the sorted indices by counts[sorted[g]]: with indices
    # [0, 0, 0, 1, 3, 3] group 1 (index 1) uses counts[sorted[1]] = counts[0] = 3, not 1
    weight = torch.ones(4, 1, dtype=torch.float64, requires_grad=True)
    indices, offsets = torch.tensor([0, 0, 0, 1, 3, 3]), torch.tensor([0])
    want = torch.autograd.grad(
        F.embedding_bag(indices, weight, offsets, mode="sum", scale_grad_by_freq=True).sum(), weight
    )[0]
    with _mode():
        got = torch.autograd.grad(
            F.embedding_bag(indices, weight, offsets, mode="sum", scale_grad_by_freq=True).sum(), weight
        )[0]
    assert torch.equal(got, want)
    assert want[1, 0].item() == pytest.approx(1 / 3)  # the kernel's lookup, not 1 / count(1)
