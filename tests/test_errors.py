"""Every error path names the op, what was expected and found, and the remedy."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from tests.compare import assert_raises_like_eager

aten = torch.ops.aten


def test_unsupported_op_names_op_chain_and_remedy():
    small = ed.OpSet.preset("core_aten") - ["aten::mm.default"]
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with pytest.raises(ed.UnsupportedOpError) as info:
        with ed.EagerDecompMode(small):
            torch.mm(a, b)
    e = info.value
    assert e.op is aten.mm.default and e.chain == (aten.mm.default,)
    msg = str(e)
    assert "aten.mm.default" in msg and "no decomposition" in msg and "register_decomposition" in msg
    assert "on_unsupported='fallthrough'" in msg  # the mode can run it natively; the message says how


def test_unsupported_chain_names_the_blocking_op():
    # silu -> sigmoid, and sigmoid's own decomposition needs exp, which is removed
    small = ed.OpSet.preset("core_aten") - ["aten::sigmoid", "aten::exp.default"]
    with pytest.raises(ed.UnsupportedOpError, match=r"aten\.silu\.default -> .*aten\.exp\.default"):
        with ed.EagerDecompMode(small):
            F.silu(torch.randn(3))


def test_prims_has_no_matmul():
    with pytest.raises(ed.UnsupportedOpError, match="aten.mm.default"):
        with ed.EagerDecompMode("prims"):
            torch.mm(torch.randn(2, 2), torch.randn(2, 2))


def test_on_unsupported_fallthrough_runs_natively_and_counts():
    small = ed.OpSet.preset("core_aten") - ["aten::mm.default"]
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with ed.EagerDecompMode(small, on_unsupported="fallthrough") as m:
        out = torch.mm(a, b)
    torch.testing.assert_close(out, a @ b)
    row = m.report().row(aten.mm.default)
    assert row.route == "unsupported" and row.fallthrough == 1


def test_on_unsupported_warn():
    small = ed.OpSet.preset("core_aten") - ["aten::mm.default"]
    with pytest.warns(UserWarning, match="no path to the target opset"):
        with ed.EagerDecompMode(small, on_unsupported="warn"):
            torch.mm(torch.randn(2, 2), torch.randn(2, 2))


def test_bad_on_unsupported_value():
    with pytest.raises(ed.EagerDecompError, match="on_unsupported must be one of"):
        ed.EagerDecompMode("core_aten", on_unsupported="ignore")


def test_decomposition_cycle_is_an_error_not_a_recursion_error():
    cycle = {
        aten.silu.default: lambda x: aten.hardswish.default(x),
        aten.hardswish.default: lambda x: aten.silu.default(x),
    }
    with pytest.raises(ed.UnsupportedOpError, match="decomposition cycle"):
        with ed.EagerDecompMode("core_aten", decompositions=cycle):
            F.silu(torch.randn(3))


def test_mixed_devices():
    with pytest.raises(
        ed.DeviceMismatchError, match=r"aten.addcmul.default: expected all tensor arguments on one device.*cpu.*meta"
    ):
        with ed.EagerDecompMode("core_aten"):
            torch.addcmul(torch.randn(3), torch.randn(3, device="meta"), torch.randn(3))


def test_cpu_scalar_tensor_may_mix_like_eager():
    x = torch.randn(3, device="meta")
    with ed.EagerDecompMode("core_aten"):
        y = torch.addcmul(x, x, x, value=0.5) + torch.tensor(2.0)
    assert y.device.type == "meta" and y.shape == (3,)


def test_wrong_decomposition_is_caught_against_the_meta_kernel():
    wrong = {aten.silu.default: lambda x: x.to(torch.float64)}
    with pytest.raises(
        ed.MismatchError, match=r"aten.silu.default: output 0 .*torch.float64.*eager gives torch.float32"
    ):
        with ed.EagerDecompMode("core_aten", decompositions=wrong):
            F.silu(torch.randn(3))


def test_inplace_decomposition_must_return_its_input():
    wrong = {aten.add_.Tensor: lambda x, y, alpha=1: aten.add.Tensor(x, y)}
    with pytest.raises(ed.MismatchError, match="does not return the mutated input 'self'"):
        with ed.EagerDecompMode("core_aten", decompositions=wrong):
            torch.randn(3).add_(torch.randn(3))


def test_decompositions_argument_is_checked():
    with pytest.raises(ed.UnsupportedArgumentError, match="must be callable"):
        ed.EagerDecompMode("core_aten", decompositions={aten.silu.default: 3})
    with pytest.raises(ed.UnsupportedArgumentError, match="mapping"):
        ed.EagerDecompMode("core_aten", decompositions=[aten.silu.default])
    with pytest.raises(ed.UnknownOpError, match="aten::sillu"):
        ed.EagerDecompMode("core_aten", decompositions={"aten::sillu": lambda x: x})


def test_unknown_opset_name():
    with pytest.raises(ed.UnknownOpError, match="did you mean"):
        ed.EagerDecompMode(["aten::mull.Tensor"])


def test_invalid_arguments_raise_the_eager_error_type():
    # a shape mismatch is the user's error: it must surface as eager's RuntimeError, not ours
    # (ours is a RuntimeError too: the type must be eager's exactly, and so the message)
    # (the decomposition broadcasts its operands in another order: the message names them so)
    native, ours = assert_raises_like_eager(
        torch.addcmul, torch.randn(3), torch.randn(4), torch.randn(3), message=r"The size of tensor a \(\d\) must match"
    )
    assert type(ours) is RuntimeError


def test_our_errors_are_runtime_errors_but_never_pass_for_eagers():
    # NOTE: EagerDecompError stays a RuntimeError (docs/exactness.md says why); the suite's
    # comparison tells the two apart by exact type
    assert issubclass(ed.EagerDecompError, RuntimeError)

    # eager has no bool linspace (NotImplementedError); the mode declines with UnsupportedOpError,
    # itself a NotImplementedError: pytest.raises(NotImplementedError) would take one for the other
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.linspace(0, 1, 5, dtype=torch.bool)
    with pytest.raises(NotImplementedError), ed.EagerDecompMode("core_aten"):
        torch.linspace(0, 1, 5, dtype=torch.bool)
    with pytest.raises(AssertionError, match="eagerdecomp's UnsupportedOpError where eager raises NotImplementedError"):
        assert_raises_like_eager(torch.linspace, 0, 1, 5, dtype=torch.bool)


def test_every_error_is_an_eagerdecomp_error():
    for cls in (
        ed.UnknownOpError,
        ed.UnsupportedOpError,
        ed.UnsupportedArgumentError,
        ed.DeviceMismatchError,
        ed.TraceError,
        ed.MismatchError,
        ed.BackendError,
    ):
        assert issubclass(cls, ed.EagerDecompError)
