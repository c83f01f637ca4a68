"""Custom ops under eagerdecomp (eagerdecomp/routes.py): a Python or composite implementation
runs under eagerdecomp, so the ATen ops inside are decomposed; an opaque kernel passes through
and is counted on its own route; a registered decomposition wins over both. The same rules hold
on the device switch and in the compile backend."""

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.dynamo.backend import compile_backend
from eagerdecomp.errors import BackendError
from eagerdecomp.testing import RecordingMode

try:
    from eagerdecomp.device.refdev import reference_device

    DEV = reference_device()  # before any backward pass in this process (see refdev._check_autograd)
except BackendError:
    DEV = None

needs_device = pytest.mark.skipif(DEV is None, reason="reference device unavailable")


# -- the ops under test: one of each kind ------------------------------------------------
@torch.library.custom_op("edtest::scaled_silu", mutates_args=())
def scaled_silu(x: Tensor, s: float) -> Tensor:
    return F.silu(x) * s  # silu is not core ATen: decomposed when run under eagerdecomp


@scaled_silu.register_fake
def _(x, s):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.s = inputs[1]


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.aten.silu_backward(grad, x) * ctx.s, None  # silu_backward is not core either


scaled_silu.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("edtest::cpu_only_softplus", mutates_args=(), device_types="cpu")
def cpu_only_softplus(x: Tensor) -> Tensor:
    return F.softplus(x)


@torch.library.triton_op("edtest::tri_gelu", mutates_args=())
def tri_gelu(x: Tensor) -> Tensor:
    # NOTE: a triton_op's body is Python; this one launches no Triton kernel (no GPU here),
    # so what is checked is the routing of the op itself, not a kernel launch
    return F.hardswish(x) + x


_lib = torch.library.Library("edtest", "DEF")  # noqa: TOR901 - test ops
_lib.define("composite_mish(Tensor x) -> Tensor")
_lib.impl("composite_mish", lambda x: F.mish(x), "CompositeImplicitAutograd")
_lib.define("never_runs(Tensor x) -> Tensor")


def _refuse(x):
    raise AssertionError("the kernel ran although a decomposition is registered")


_lib.impl("never_runs", _refuse, "CPU")
_lib.define("torch_decomposed(Tensor x) -> Tensor")
_lib.impl("torch_decomposed", _refuse, "CPU")


@ed.register_decomposition("edtest::never_runs")
def _never_runs(x):
    return F.elu(x) * 2


import torch._decomp  # noqa: E402

torch._decomp.register_decomposition(torch.ops.edtest.torch_decomposed.default)(lambda x: F.selu(x) - 1)

OPAQUE = torch.ops.quantization._FloatToBfloat16Quantized.default  # a C++ TORCH_LIBRARY op, CPU kernel only


def routes_of(mode):
    return {r.op: r.route for r in mode.report().rows}


def test_python_custom_op_runs_its_implementation_under_the_mode():
    x = torch.randn(6)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        y = scaled_silu(x, 3.0)
    torch.testing.assert_close(y, F.silu(x) * 3.0)
    assert rec.outside("core_aten") == []
    routes = routes_of(mode)
    assert routes["edtest.scaled_silu.default"] == "custom op"
    assert routes["aten.silu.default"] == "decomposed"


def test_autograd_through_a_custom_op_with_register_autograd():
    x = torch.randn(5, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    (F.silu(ref) * 2.5).sum().backward()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        scaled_silu(x, 2.5).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)
    assert rec.outside("core_aten") == []
    assert routes_of(mode)["aten.silu_backward.default"] == "decomposed"  # from the registered backward


def test_triton_op_body_runs_under_the_mode():
    x = torch.randn(7)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        y = tri_gelu(x)
    torch.testing.assert_close(y, F.hardswish(x) + x)
    assert rec.outside("core_aten") == []
    assert routes_of(mode)["edtest.tri_gelu.default"] == "custom op"


def test_composite_implicit_custom_ops_decompose_through_their_kernel():
    x = torch.randn(4, 3)
    # NOTE: under inference mode the autograd keys that would expand a CompositeImplicitAutograd
    # kernel before any mode are off, so the mode meets the custom op itself
    with torch.inference_mode(), RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        y = torch.ops.edtest.composite_mish(x)
        z = torch.ops._test.leaky_relu(x, 0.2)  # a C++ TORCH_LIBRARY op with a composite kernel
    torch.testing.assert_close(y, F.mish(x))
    torch.testing.assert_close(z, F.leaky_relu(x, 0.2))
    assert rec.outside("core_aten") == []
    routes = routes_of(mode)
    assert routes["edtest.composite_mish.default"] == "decomposed"
    assert routes["_test.leaky_relu.default"] == "decomposed"


@torch.library.custom_op("edtest::silu_in_place", mutates_args=("x",))
def silu_in_place(x: Tensor) -> None:
    x.copy_(F.silu(x))


def test_mutating_custom_op_writes_its_argument_under_the_mode():
    x = torch.randn(6)
    expected = F.silu(x)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        silu_in_place(x)
    torch.testing.assert_close(x, expected)
    assert rec.outside("core_aten") == [] and routes_of(mode)["edtest.silu_in_place.default"] == "custom op"


def test_opaque_kernel_passes_through_and_is_reported():
    x = torch.randn(4, 3)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        y = OPAQUE(x)
    assert torch.equal(y, OPAQUE(x))
    assert rec.outside("core_aten") == [str(OPAQUE)]  # it reached the kernels below, untouched
    row = mode.report().row(OPAQUE)
    assert row.route == "custom kernel" and row.routed == {"custom kernel": 1}
    assert "custom kernel" in str(mode.report())


def test_registered_decompositions_win_over_the_kernel():
    x = torch.randn(5)
    with pytest.raises(AssertionError, match="kernel ran"):
        torch.ops.edtest.never_runs(x)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        a = torch.ops.edtest.never_runs(x)  # eagerdecomp.register_decomposition
        b = torch.ops.edtest.torch_decomposed(x)  # torch._decomp.register_decomposition
    torch.testing.assert_close(a, F.elu(x) * 2)
    torch.testing.assert_close(b, F.selu(x) - 1)
    assert rec.outside("core_aten") == []
    assert routes_of(mode)["edtest.never_runs.default"] == "decomposed"


def test_per_mode_decomposition_replaces_an_opaque_kernel():
    x = torch.randn(4, 3)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten", decompositions={OPAQUE: lambda t: t.half()}):
        y = OPAQUE(x)
    assert y.dtype == torch.float16 and rec.outside("core_aten") == []


@pytest.mark.usefixtures("trace_first")  # counts a traced kernel's hit
def test_custom_ops_met_inside_a_decomposition_follow_the_same_rules():
    x = torch.randn(4, 3)
    hardswish = torch.ops.aten.hardswish.default
    # a Python custom op inside a decomposition is lowered through its body, into the cached kernel
    with (
        RecordingMode() as rec,
        ed.EagerDecompMode("core_aten", decompositions={hardswish: lambda t: scaled_silu(t, 0.5) + 1}) as mode,
    ):
        ys = [F.hardswish(x) for _ in range(2)]
    for y in ys:
        torch.testing.assert_close(y, F.silu(x) * 0.5 + 1)
    row = mode.report().row(hardswish)
    assert rec.outside("core_aten") == [] and row.route == "decomposed" and row.hits == 1
    assert "aten.sigmoid.default" in row.into
    # an opaque kernel is kept as a call; with no meta kernel it cannot be traced over fake
    # tensors, so that decomposition runs eagerly on every call (still only opset ops besides it)
    with (
        RecordingMode() as rec,
        ed.EagerDecompMode("core_aten", decompositions={hardswish: lambda t: OPAQUE(t).float()}) as mode,
    ):
        y = F.hardswish(x)
    torch.testing.assert_close(y, OPAQUE(x).float())
    assert rec.outside("core_aten") == [str(OPAQUE)] and mode.report().row(hardswish).route == "bypassed"


def test_compile_backend_lowers_python_custom_ops_and_keeps_opaque_ones():
    torch._dynamo.reset()
    be = compile_backend("core_aten")
    fn = torch.compile(lambda x: scaled_silu(x, 2.0) + tri_gelu(x), backend=be, fullgraph=True)
    x = torch.randn(6)
    torch.testing.assert_close(fn(x), F.silu(x) * 2.0 + F.hardswish(x) + x)
    assert be.outside_opset() == []
    assert not any(op.namespace == "edtest" for op in be.ops())  # lowered through their bodies


@needs_device
def test_device_switch_runs_python_custom_ops_and_refuses_opaque_ones():
    device_switch.disable(DEV)
    device_switch.enable(DEV)
    try:
        x = torch.randn(6)
        y = scaled_silu(x.to(DEV), 1.5)  # its default kernel serves every device; silu is decomposed
        torch.testing.assert_close(y.cpu(), F.silu(x) * 1.5)
        with pytest.raises(BackendError, match=r"edtest.cpu_only_softplus.*no kernel for 'edref'"):
            cpu_only_softplus(x.to(DEV))
        with pytest.raises(BackendError, match=r"quantization._FloatToBfloat16Quantized"):
            OPAQUE(torch.randn(4, 3).to(DEV))
        z = torch.ops.edtest.never_runs(x.to(DEV))  # no edref kernel, but a decomposition
        torch.testing.assert_close(z.cpu(), F.elu(x) * 2)
    finally:
        device_switch.disable(DEV)
