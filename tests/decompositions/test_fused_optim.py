"""Fused optimizers (eagerdecomp/decompositions/fused_optim.py): several steps of
SGD/Adam/AdamW(fused=True) under the mode on CPU and on edref with the switch, against the CPU's
fused kernels (native eager): parameters, optimizer states and gradients to rounding, with their
dtypes, shapes, strides and version counters; the ops called directly with ``grad_scale`` and
``found_inf``; eager's errors for dtypes and lists its kernels refuse."""

import pytest
import torch
import torch.optim as optim

import eagerdecomp as ed
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten

CONFIGS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1, fused=True),
    "sgd momentum dampening weight_decay": lambda ps: optim.SGD(
        ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01, fused=True
    ),
    "sgd nesterov maximize": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, maximize=True, fused=True),
    "sgd tensor lr": lambda ps: optim.SGD(ps, lr=torch.tensor(0.05), momentum=0.5, fused=True),
    "adam": lambda ps: optim.Adam(ps, lr=0.01, fused=True),
    "adam weight_decay amsgrad maximize": lambda ps: optim.Adam(
        ps, lr=0.01, betas=(0.6, 0.9), weight_decay=0.1, amsgrad=True, maximize=True, fused=True
    ),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, fused=True),
    "adamw amsgrad tensor lr": lambda ps: optim.AdamW(ps, lr=torch.tensor(0.01), amsgrad=True, fused=True),
}
ADAMS = [name for name in CONFIGS if name.startswith("adam")]


def _train(make, dtype, device="cpu", steps=3, mode=None):
    """``steps`` optimizer steps on two parameters (one with a tail past the kernel's vector
    width); returns parameters, gradients and state tensors, and the versions of those the fused
    op writes. Under ``mode``, only core ATen ops reach the kernels."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(37, generator=gen), torch.randn(4, 9, generator=gen)]
    params = [p.to(device=device, dtype=dtype).requires_grad_() for p in params]
    opt = make(params)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device=device, dtype=dtype)
        if mode is None:
            opt.step()
        else:
            with RecordingMode() as rec, mode:  # the independent witness, around the step alone
                opt.step()
            rec.assert_only("core_aten")
    states = [(k, t) for p in params for k, t in opt.state[p].items() if isinstance(t, torch.Tensor)]
    tensors = [p.detach() for p in params] + [p.grad for p in params] + [t for _, t in states]
    # NOTE: the step counts are advanced by _foreach_add_, whose CPU kernel bumps versions by calling
    # add_ per tensor; the mode's _foreach_add_ does not bump them (docs/limits.md)
    written = [p.detach() for p in params] + [p.grad for p in params] + [t for k, t in states if k != "step"]
    return tensors, [t._version for t in written]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        torch.testing.assert_close(g.cpu(), w.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_steps_under_the_mode_match_the_cpu_kernels(name, dtype):
    want, want_versions = _train(CONFIGS[name], dtype)
    got, got_versions = _train(CONFIGS[name], dtype, mode=ed.EagerDecompMode("core_aten"))
    assert_same(got, want)
    assert got_versions == want_versions


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ADAMS)
def test_fused_adam_of_16_bit_floats_computes_in_float32_as_the_kernel(name, dtype):
    want, _ = _train(CONFIGS[name], dtype)
    got, _ = _train(CONFIGS[name], dtype, mode=ed.EagerDecompMode("core_aten"))
    assert_same(got, want)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_steps_on_the_device_decline_to_keep_eagers_versions(name, switched_device):
    # NOTE: on the device the decomposition's writes would bump versions the CPU's fused kernels
    # never bump (fused_optim.py): it declines, and without the CPU tier the step is a clear error
    with pytest.raises(ed.UnsupportedOpError, match="_fused_"):
        _train(CONFIGS[name], torch.float32, device=switched_device)


def _adam_lists(dtype, amsgrad):
    gen = torch.Generator().manual_seed(1)
    shapes = [(19,), (3, 11)]
    params = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    grads = [torch.randn(s, generator=gen, dtype=dtype) * 1024 for s in shapes]
    exp_avgs = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    exp_avg_sqs = [torch.rand(s, generator=gen, dtype=dtype) for s in shapes]
    maxes = [torch.rand(s, generator=gen, dtype=dtype) for s in shapes] if amsgrad else []
    steps = [torch.tensor(3.0), torch.tensor(7.0)]
    return params, grads, exp_avgs, exp_avg_sqs, maxes, steps


@pytest.mark.parametrize("found", [0.0, 1.0])
@pytest.mark.parametrize("op", [aten._fused_adam_.default, aten._fused_adamw_.default])
def test_grad_scale_unscales_gradients_and_found_inf_skips_the_step(op, found):
    kwargs = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.05, eps=1e-8, amsgrad=True, maximize=False)
    kwargs.update(grad_scale=torch.tensor(1024.0), found_inf=torch.tensor(found))
    want = _adam_lists(torch.float32, True)
    got = _adam_lists(torch.float32, True)
    before = [t.clone() for ts in want for t in ts]
    op(*want, **kwargs)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        op(*got, **kwargs)
    rec.assert_only("core_aten")
    flat_want, flat_got = [t for ts in want for t in ts], [t for ts in got for t in ts]
    assert_same(flat_got, flat_want)
    assert [t._version for t in flat_got] == [t._version for t in flat_want]
    assert any(not torch.equal(a, b) for a, b in zip(flat_want, before)) == (found == 0.0)


@pytest.mark.parametrize("found", [0.0, 1.0])
def test_fused_sgd_with_grad_scale_and_found_inf(found):
    kwargs = dict(weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True, maximize=False)
    kwargs.update(is_first_step=False, grad_scale=torch.tensor(64.0), found_inf=torch.tensor(found))

    def lists():
        gen = torch.Generator().manual_seed(2)
        return [[torch.randn(21, generator=gen) for _ in range(2)] for _ in range(3)]

    want, got = lists(), lists()
    aten._fused_sgd_.default(*want, **kwargs)
    with ed.EagerDecompMode("core_aten"):
        aten._fused_sgd_.default(*got, **kwargs)
    assert_same([t for ts in got for t in ts], [t for ts in want for t in ts])


def test_eagers_errors_for_dtypes_and_lists_its_kernels_refuse():
    ints = [[torch.zeros(3, dtype=torch.int32)] for _ in range(4)]
    kwargs = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    calls = [
        lambda: aten._fused_adam_.default(*ints, [], [torch.tensor(1.0)], **kwargs),
        lambda: aten._fused_adamw_.default([torch.zeros(3)], [], [torch.zeros(3)], [torch.zeros(3)], [], [], **kwargs),
    ]
    for call in calls:
        with pytest.raises((RuntimeError, NotImplementedError)) as want:
            call()
        with pytest.raises(type(want.value)) as got, ed.EagerDecompMode("core_aten"):
            call()
        assert str(got.value) == str(want.value)


def test_fused_sgd_of_16_bit_floats_is_refused_not_miscomputed():
    # the CPU kernel leaves most 16-bit parameters unchanged (a PyTorch bug): eager is no SGD step
    p = torch.randn(40, dtype=torch.bfloat16)
    before = p.clone()
    aten._fused_sgd_.default([p], [torch.ones_like(p)], [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0,
                             nesterov=False, maximize=False, is_first_step=False)  # fmt: skip
    assert torch.equal(p[:32], before[:32]) and not torch.equal(p[32:], before[32:])
    with pytest.raises(UnsupportedOpError, match="bfloat16"), ed.EagerDecompMode("core_aten"):
        q = torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)
        q.grad = torch.ones_like(q)
        optim.SGD([q], lr=0.1, fused=True).step()


FUNCTIONAL = {
    "adam": (aten._fused_adam.default, dict(beta1=0.9, beta2=0.99, eps=1e-8, amsgrad=True, maximize=False)),
    "adamw tensor lr": (
        aten._fused_adamw.tensor_lr,
        dict(beta1=0.9, beta2=0.99, eps=1e-8, amsgrad=False, maximize=True),
    ),
    "sgd": (
        aten._fused_sgd.default,
        dict(momentum=0.9, dampening=0.0, nesterov=False, maximize=False, is_first_step=False),
    ),
}


@pytest.mark.parametrize("name", list(FUNCTIONAL))
def test_functional_forms_step_clones_and_leave_their_inputs(name):
    # (what functionalization and torch.compile produce from the in-place ops)
    op, kwargs = FUNCTIONAL[name]
    kwargs = dict(kwargs, weight_decay=0.1, lr=torch.tensor(0.01) if "tensor" in name else 0.01)

    def args():
        gen = torch.Generator().manual_seed(3)
        lists = [[torch.randn(6, 5, generator=gen).t(), torch.randn(7, generator=gen)] for _ in range(3)]
        if name == "sgd":
            return lists
        sqs = [[torch.rand(5, 6, generator=gen), torch.rand(7, generator=gen)] for _ in range(2)]
        return lists + sqs[:1] + (sqs[1:] if kwargs["amsgrad"] else [[]]) + [[torch.tensor(2.0), torch.tensor(5.0)]]

    mine, theirs = args(), args()
    want = op(*theirs, **kwargs)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = op(*mine, **kwargs)
    rec.assert_only("core_aten")
    assert [len(ts) for ts in got] == [len(ts) for ts in want]
    assert_same([t for ts in got for t in ts], [t for ts in want for t in ts])
    assert all(torch.equal(a, b) for x, y in zip(mine, theirs) for a, b in zip(x, y))  # inputs as eager left them


@pytest.mark.parametrize("where", ["mode"])
def test_layouts_that_differ_are_paired_by_memory_position_as_the_kernel_does(where, request):
    # the kernel walks each tensor from its data pointer, strides unread: a transposed parameter
    # with a contiguous momentum buffer is stepped element by memory position
    kwargs = dict(weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False)
    kwargs.update(is_first_step=False)
    dev = request.getfixturevalue("switched_device") if where == "edref" else "cpu"

    def lists(device):
        gen = torch.Generator().manual_seed(4)
        param, grad = torch.randn(6, 5, generator=gen).t(), torch.randn(6, 5, generator=gen).t()
        return [[param.to(device)], [grad.to(device)], [torch.randn(5, 6, generator=gen).to(device)]]

    want, got = lists("cpu"), lists(dev)
    aten._fused_sgd_.default(*want, **kwargs)
    if where == "mode":
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            aten._fused_sgd_.default(*got, **kwargs)
        rec.assert_only("core_aten")
    else:
        aten._fused_sgd_.default(*got, **kwargs)
    assert_same([t for ts in got for t in ts], [t for ts in want for t in ts])
