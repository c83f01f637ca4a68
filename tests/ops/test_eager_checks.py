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


def _elu_backward_of_in_place(a):
    a = a.clone().requires_grad_()
    b = torch.nn.functional.elu_(a.clone(), alpha=-2.0)
    b.backward(torch.ones_like(b))
    return a.grad


REFUSED = {  # case: (fn, tensors..., eager's error type); the meta kernel or eagerdecomp.checks
    "addcdiv on int16": (lambda a: torch.addcdiv(a, a, a), torch.ones(3, dtype=torch.int16), RuntimeError),
    "replication pad of an empty dim": (lambda a: torch.nn.ReplicationPad1d(3)(a), torch.randn(2, 0, 5), RuntimeError),
    "nll_loss with a weight of another size": (
        lambda x, t, w: torch.nn.functional.nll_loss(x, t, weight=w),
        torch.randn(10, 3),
        torch.randint(0, 3, (10,)),
        torch.randn(4),
        RuntimeError,
    ),
    "index_fill with a complex value": (
        lambda a, i: a.index_fill(0, i, 1 + 1j),
        torch.randn(3),
        torch.tensor([0]),
        RuntimeError,
    ),
    "masked_select with an integer mask": (
        lambda a, m: a.masked_select(m),
        torch.randn(3),
        torch.ones(3, dtype=torch.int64),
        RuntimeError,
    ),
    "logcumsumexp into an out of another dtype": (
        lambda a, o: torch.logcumsumexp(a, 0, out=o),
        torch.randn(3),
        torch.empty(3, dtype=torch.float64),
        RuntimeError,
    ),
    "nearest upsampling of int32": (
        lambda a: torch.nn.functional.interpolate(a, scale_factor=2.0),
        torch.ones(1, 1, 4, 4, dtype=torch.int32),
        NotImplementedError,
    ),
    "bilinear upsampling of int64": (
        lambda a: torch.nn.functional.interpolate(a, scale_factor=2.0, mode="bilinear"),
        torch.ones(1, 1, 4, 4, dtype=torch.int64),
        NotImplementedError,
    ),
    "backward of elu_ with a negative alpha": (_elu_backward_of_in_place, torch.tensor([-1.0, 1.0]), RuntimeError),
    # a decomposition that declines these would say "no path": eager's error is the one to give
    "multilabel margin loss of an empty vector": (
        lambda x, y: torch.nn.functional.multilabel_margin_loss(x, y),
        torch.randn(0),
        torch.ones(10, dtype=torch.long),
        RuntimeError,
    ),
    "grid_sampler_3d with another batch size": (
        lambda x, g: torch.nn.functional.grid_sample(x, g, align_corners=False),
        torch.randn(5, 5, 5, 5, 5),
        torch.randn(1, 1, 1, 4, 3),
        RuntimeError,
    ),
    "backward of leaky_relu_ with a negative slope": (
        lambda a: _backward_of_in_place(a, lambda t: torch.nn.functional.leaky_relu_(t, -2.0)),
        torch.tensor([-1.0, 1.0]),
        RuntimeError,
    ),
    "backward of rrelu_ out of training with a negative mean slope": (
        lambda a: _backward_of_in_place(a, lambda t: torch.nn.functional.rrelu_(t, -5.0, 1.0)),
        torch.tensor([-1.0, 1.0]),
        RuntimeError,
    ),
}


def _backward_of_in_place(a, fn):
    a = a.clone().requires_grad_()
    b = fn(a.clone())
    b.backward(torch.ones_like(b))
    return a.grad


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_eager_refuses_is_refused(case, switched_device):
    fn, *tensors, error = REFUSED[case]
    native, mode, dev = _run_everywhere(fn, *tensors, device=switched_device)
    assert native is error and mode is error and dev is error  # (the exact type: no UnsupportedOpError)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [False, True])
def test_uint8_resizing_is_bitwise_eager(mode, antialias, switched_device):
    # eager's uint8 kernel resizes in fixed point (PIL's); floats rounded at the end miss by
    # one level here and there. Channels 3 take the kernel's vectorized path, 5 its generic one
    g = torch.Generator().manual_seed(0)
    for channels, size, align_corners, layout in (
        (3, (6, 6), False, torch.contiguous_format),
        (5, (17, 29), False, torch.channels_last),
        (1, (30, 11), True, torch.contiguous_format),
        (3, (9, 40), False, torch.channels_last),
    ):
        if antialias and align_corners:
            continue
        x = torch.randint(0, 256, (2, channels, 13, 21), dtype=torch.uint8, generator=g).contiguous(
            memory_format=layout
        )

        def fn(t):
            return torch.nn.functional.interpolate(
                t, size=size, mode=mode, antialias=antialias, align_corners=align_corners
            )

        native, under_mode, dev = _run_everywhere(fn, x, device=switched_device)
        assert _same(under_mode, native) and _same(dev, native), (channels, size, align_corners)


def test_a_resized_out_takes_eagers_strides_even_of_size_one_dims(switched_device):
    base = torch.randn(1, 1, 4, 12)
    x = base[:, :, :, ::2].permute(0, 2, 1, 3)
    d = base.to(switched_device)[:, :, :, ::2].permute(0, 2, 1, 3)
    for op in (torch.eq, torch.add):
        want = op(x, x, out=torch.empty(0, dtype=op(x, x).dtype))
        assert want.stride() == (24, 6, 24, 1)
        with ed.EagerDecompMode("core_aten"):
            got = op(x, x, out=torch.empty(0, dtype=want.dtype))
        assert got.stride() == want.stride() and torch.equal(got, want)
        got = op(d, d, out=torch.empty(0, dtype=want.dtype, device=switched_device))
        assert got.stride() == want.stride() and torch.equal(got.cpu(), want)


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


EXPANDED = {  # in-place ops eager lets write a tensor that overlaps itself; True: it warns
    "fill_": (lambda x, d: x.fill_(0.25), False),
    "zero_": (lambda x, d: x.zero_(), False),
    "threshold_": (lambda x, d: torch.nn.functional.threshold_(x, 0.5, 0.75), False),
    "masked_fill_": (lambda x, d: x.masked_fill_(torch.tensor([[False, True, False]] * 2, device=d), 2.0), True),
    "index_fill_": (lambda x, d: x.index_fill_(1, torch.tensor([2], device=d), -1.0), True),
    "index_put_": (lambda x, d: x.index_put_((torch.tensor([1], device=d),), torch.tensor(5.0, device=d)), True),
}


def _expanded(device):
    # a [2, 3] tensor over 3 slots: rows alias each other
    return torch.tensor([[0.1, 0.7, 0.3]], device=device).expand(2, 3)


@pytest.mark.parametrize("opset", ["core_aten", "prims_fusion"])
@pytest.mark.parametrize("name", sorted(EXPANDED))
def test_writes_into_an_expanded_tensor_as_eager(name, opset, switched_device):
    import warnings

    fn, warns = EXPANDED[name]

    def run(device):
        x = _expanded(device)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert fn(x, device) is x
        assert x.stride() == (0, 1)
        return (
            x.cpu(),
            x._base.cpu(),
            [str(w.message) for w in seen if "on expanded tensors is deprecated" in str(w.message)],
        )

    want = run("cpu")
    assert len(want[2]) == int(warns)
    for _ in range(2):  # traced, then replayed: the same values, and eager's warning again, word for word
        with RecordingMode() as rec, ed.EagerDecompMode(opset):
            got = run("cpu")
        rec.assert_only(opset)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert [m.split(" (Triggered")[0] for m in got[2]] == [m.split(" (Triggered")[0] for m in want[2]]
        if opset == "core_aten":  # (the reference device's preset)
            got = run(switched_device)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and len(got[2]) == len(want[2])


def test_other_in_place_ops_still_refuse_an_expanded_tensor(switched_device):
    for device in ("cpu", switched_device):
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            with ed.EagerDecompMode("core_aten"):
                _expanded(device).clamp_(0.2, 0.5)


@pytest.mark.parametrize("loss", ["multi_margin", "multilabel_margin"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses_of_an_empty_batch_have_an_empty_gradient(loss, reduction, switched_device):
    # NOTE: eager's CPU kernels leave a mean or sum over no samples uninitialized (its value is
    # whatever memory held); the gradient is defined: empty
    mod = (
        torch.nn.MultiMarginLoss(reduction=reduction)
        if loss == "multi_margin"
        else torch.nn.MultiLabelMarginLoss(reduction=reduction)
    )
    target = torch.ones(0, dtype=torch.long) if loss == "multi_margin" else torch.ones(0, 10, dtype=torch.long)
    for device in ("mode", switched_device):
        x = torch.randn(0, 10, device="cpu" if device == "mode" else device, requires_grad=True)
        t = target.to(x.device)
        if device == "mode":
            with ed.EagerDecompMode("core_aten"):
                mod(x, t).sum().backward()
        else:
            mod(x, t).sum().backward()
        assert x.grad.shape == (0, 10) and x.grad.device == x.device


def test_nll_loss_takes_uint8_targets_as_eager(switched_device):
    x, t = torch.randn(5, 4), torch.tensor([0, 3, 1, 2, 3], dtype=torch.uint8)

    def fn(x, t):
        x = x.clone().requires_grad_()
        loss = torch.nn.functional.nll_loss(x, t)
        loss.backward()
        return torch.cat([loss.reshape(1), x.grad.reshape(-1)])

    native, mode, dev = _run_everywhere(fn, x, t, device=switched_device)
    # NOTE: eager's mean reduction sums in its own order, so the loss can differ in the last
    # bit from the decomposition's, with long targets as with uint8 ones: values to rounding
    for got in (mode, dev):
        assert isinstance(got, torch.Tensor) and got.dtype == native.dtype and got.shape == native.shape
        torch.testing.assert_close(got, native)


def _cross_entropy_after_a_valid_call(x, t):
    # the valid call traces the kernel; the one with a bad label replays it
    torch.nn.functional.cross_entropy(x, torch.zeros_like(t))
    return torch.nn.functional.cross_entropy(x, t)


# a label out of range (a training script's classic bug): eager's kernels raise IndexError
OUT_OF_RANGE = {
    "past the last class": (torch.randn(4, 3), torch.tensor([0, 3, 1, 2])),
    "negative": (torch.randn(4, 3), torch.tensor([0, -1, 1, 2])),
    "negative, beside ignore_index": (torch.randn(4, 3), torch.tensor([-100, -2, 1, 2])),
    "unbatched": (torch.randn(3), torch.tensor(5)),
    "2d (nll_loss2d)": (torch.randn(2, 3, 2, 2), torch.tensor([[[0, 1], [2, 7]], [[0, 0], [-100, 1]]])),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_label_out_of_range_raises_eagers_index_error(case, switched_device):
    x, t = OUT_OF_RANGE[case]
    for fn in (torch.nn.functional.cross_entropy, _cross_entropy_after_a_valid_call):
        native, mode, dev = _run_everywhere(fn, x, t, device=switched_device)
        assert native is IndexError and mode is IndexError and dev is IndexError
    valid = torch.where(t == -100, t, t.clamp(0, 2))  # the same call with labels in range
    native, mode, dev = _run_everywhere(_cross_entropy_after_a_valid_call, x, valid, device=switched_device)
    for got in (mode, dev):  # (a mean reduction sums in its own order: values to rounding)
        assert got.dtype == native.dtype and got.shape == native.shape
        torch.testing.assert_close(got, native)


@pytest.mark.parametrize("warn_only", [False, True])
def test_nondeterminism_alerts_as_eager(warn_only, switched_device):
    import warnings

    def run(device):
        a = torch.randn(10, device=device)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                a.put_(torch.tensor([0, 0], device=device), torch.tensor([0.0, 1.0], device=device))
            except RuntimeError as e:
                return "raised", "put_ does not have a deterministic implementation" in str(e)
        return "warned", sum("put_ does not have a deterministic implementation" in str(w.message) for w in seen)

    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        want = run("cpu")
        assert want == (("warned", 1) if warn_only else ("raised", True))
        for _ in range(2):  # traced, then replayed
            with ed.EagerDecompMode("core_aten"):
                assert run("cpu") == want
            assert run(switched_device) == want
    finally:
        torch.use_deterministic_algorithms(False)
    with ed.EagerDecompMode("core_aten"):  # and nothing when the flag is off
        assert run("cpu") == ("warned", 0)
