"""What a call through eagerdecomp leaves behind: nothing, even when it raises.

PyTorch's dispatch guards restore the whole thread-local key set they saw when made,
and Python frames hold some of them (``Tensor.__repr__`` holds one). A failed call's
frames kept alive by its traceback used to free such a guard after the dispatcher's
own guards had unwound, turning autograd off in the thread for good. And forward-mode
AD (``torch.func.jvp``, dual tensors) used to fail inside decompositions, because
printing a tensor below autograd reaches ``_fw_primal``'s stub.
"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import jvp

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def dispatch_state():
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        str(torch._C._dispatch_tls_local_include_set()),
        str(torch._C._dispatch_tls_local_exclude_set()),
        fwAD._current_level,
    )


def _holds_a_guard_then_raises(x):
    # as Tensor.__repr__ does: a save-and-restore guard held by a frame, made below the mode
    guard = torch._C._DisableFuncTorch()  # noqa: F841
    raise ValueError("refused by this decomposition")


def _autograd_works() -> bool:
    return (torch.randn(2, requires_grad=True) * 2).requires_grad


def test_a_caught_exception_leaves_the_dispatch_state_as_it_was():
    before = dispatch_state()
    with pytest.raises(ValueError, match="refused"):
        with ed.EagerDecompMode("core_aten", decompositions={aten.silu.default: _holds_a_guard_then_raises}):
            F.silu(torch.randn(3))
    assert dispatch_state() == before
    assert _autograd_works()


def test_a_caught_exception_on_the_device_leaves_the_dispatch_state_as_it_was(switched_device):
    ed.disable(switched_device)
    ed.enable(switched_device, decompositions={aten.silu.default: _holds_a_guard_then_raises})
    before = dispatch_state()
    x = torch.randn(3, device=switched_device)
    with pytest.raises(ValueError, match="refused"):
        F.silu(x)
    assert dispatch_state() == before
    assert _autograd_works()


def test_allclose_of_a_dual_tensor_under_the_mode():
    p, t = torch.randn(3), torch.randn(3)
    before = dispatch_state()
    with fwAD.dual_level():
        d = fwAD.make_dual(p, t)
        want = torch.allclose(d, p)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = torch.allclose(d, p)
    rec.assert_only("core_aten")
    assert got is want is True
    assert dispatch_state() == before and _autograd_works()


def _fn(a, b):
    return F.silu(a).cumsum(0) * torch.logaddexp(a, b)


def test_jvp_through_decomposed_ops_matches_eager():
    x, y = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    tx, ty = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    want = jvp(_fn, (x, y), (tx, ty))
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        got = jvp(_fn, (x, y), (tx, ty))
    rec.assert_only("core_aten")
    assert mode.report().row(aten.silu.default).route == "decomposed"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert fwAD._current_level == -1


def test_jvp_on_the_device_matches_cpu(switched_device):
    x, tx = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    want = jvp(lambda a: F.silu(a).cumsum(0), (x,), (tx,))
    got = jvp(lambda a: F.silu(a).cumsum(0), (x.to(switched_device),), (tx.to(switched_device),))
    torch.testing.assert_close(tuple(g.cpu() for g in got), want, rtol=0, atol=1e-12)
