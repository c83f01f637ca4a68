"""Eager's refusals and permissions, kept where a decomposition would decide otherwise.

A decomposition may compute a result for arguments eager rejects (addcdiv on integers,
padding an empty dimension) or reject what eager allows. Each case runs natively, under
the mode and on the reference device with the switch, and must end the same way: the
same result bitwise, or the same error type.
"""

import itertools

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def _on(device, fn, *tensors):
    return fn(*(t.to(device) for t in tensors))


def _run_everywhere(fn, *tensors, device=None):
    """``fn`` natively, under the mode and (given ``device``) on it: (outcome, ...) each a
    tensor or the exception type raised."""

    def outcome(call):
        try:
            out = call()
        except Exception as e:  # noqa: BLE001 - the error type is the outcome
            return type(e)
        return out.cpu() if isinstance(out, torch.Tensor) else out

    native = outcome(lambda: fn(*(t.clone() for t in tensors)))
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        mode = outcome(lambda: fn(*(t.clone() for t in tensors)))
    rec.assert_only("core_aten")
    dev = outcome(lambda: _on(device, fn, *tensors)) if device is not None else native
    return native, mode, dev


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    return a == b


REFUSED = {
    "addcdiv on int16": (lambda a: torch.addcdiv(a, a, a), torch.ones(3, dtype=torch.int16)),
    "replication pad of an empty dim": (lambda a: torch.nn.ReplicationPad1d(3)(a), torch.randn(2, 0, 5)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_eager_refuses_is_refused(case, switched_device):
    fn, *tensors = REFUSED[case]
    native, mode, dev = _run_everywhere(fn, *tensors, device=switched_device)
    assert native is RuntimeError and mode is RuntimeError and dev is RuntimeError


def test_resize_as_with_preserve_format_takes_the_templates_layout(switched_device):
    template = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)

    def fn(a, t):
        return a.resize_as_(t, memory_format=torch.preserve_format)

    native, mode, dev = _run_everywhere(fn, torch.zeros(1), template, device=switched_device)
    assert native.stride() == (60, 1, 15, 3)
    assert _same(mode.zero_(), native.zero_()) and _same(dev.zero_(), native)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32])
def test_index_reduce_is_bitwise_eager(dtype, reduce, switched_device):
    # int32 indices are eager's too; the half types round after each index entry, as eager's
    # kernel does (scatter_reduce accumulates in float and rounds once)
    g = torch.Generator().manual_seed(0)
    for dim, include_self, idx_dtype in itertools.product(range(3), (True, False), (torch.int32, torch.int64)):
        size = (3, 4, 5)
        src_size = list(size)
        src_size[dim] = 7
        dest = (torch.randn(size, generator=g) * 3).to(dtype)
        src = (torch.randn(src_size, generator=g) * 3).to(dtype)
        idx = torch.randint(0, size[dim], (7,), generator=g, dtype=idx_dtype)

        def fn(d, i, s):
            return d.index_reduce(dim, i, s, reduce, include_self=include_self)

        native, mode, dev = _run_everywhere(fn, dest, idx, src, device=switched_device)
        assert _same(mode, native), (dim, include_self, idx_dtype)
        assert _same(dev, native), (dim, include_self, idx_dtype)
