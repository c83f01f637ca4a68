"""torch.func transforms under the mode, and the metadata queries forward-mode AD asks."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, jacfwd, jacrev, jvp, vmap

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


def _f(t):
    return (F.silu(t) * F.softplus(t)).logsumexp(-1) + F.huber_loss(t, t.flip(-1))


def _g(t):
    return F.elu(t).sum() + torch.lerp(t, t.cos(), 0.3).pow(2).mean()


X, Y = (
    torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),
    torch.randn(6, generator=torch.Generator().manual_seed(1)),
)

TRANSFORMS = {
    "vmap": lambda: vmap(_f)(X),
    "grad": lambda: grad(_g)(Y),
    "vmap(grad)": lambda: vmap(grad(_g))(X),
    "jacrev": lambda: jacrev(_f)(Y),
    "jvp": lambda: jvp(_g, (Y,), (torch.ones(6),))[1],
    "jacfwd": lambda: jacfwd(_f)(Y),
    "vmap(jvp)": lambda: vmap(lambda t: jvp(_g, (t,), (torch.ones(6),))[1])(X),
    "vmap(in-place)": lambda: vmap(lambda t: F.hardswish(t.clone(), inplace=True))(X),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_transform_matches_native(name):
    want = TRANSFORMS[name]()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = TRANSFORMS[name]()
    rec.assert_only("core_aten")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_storage_queries_are_answered_per_call_not_from_a_kernel():
    # NOTE: the same key (shapes, strides, dtypes) with different storages: a kernel traced on
    # the first call would give the second call the first's answer
    a, b = torch.zeros(4), torch.zeros(4)
    big = torch.zeros(8)[:4]
    with ed.EagerDecompMode("core_aten") as mode:
        answers = [
            aten.is_set_to.default(a, a),
            aten.is_set_to.default(a, b),
            aten._has_same_storage_numel.default(a, b),
            aten._has_same_storage_numel.default(a, big),
        ]
    assert answers == [True, False, True, False]
    assert answers == [
        aten.is_set_to.default(a, a),
        aten.is_set_to.default(a, b),
        aten._has_same_storage_numel.default(a, b),
        aten._has_same_storage_numel.default(a, big),
    ]
    row = mode.report().row(aten.is_set_to.default)
    assert row.traces == 0 and row.bypassed == {"non-tensor output": 2}


def test_efficient_zero_tangents_have_no_path():
    # NOTE: a ZeroTensor's arithmetic (0 * inf = 0) happens above the mode; plain zeros from
    # core ops would turn it into NaN, so forward AD that makes one is refused, not approximated
    import torch.autograd.forward_ad as fwAD

    with ed.EagerDecompMode("core_aten"), fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(6), torch.ones(6))
        with pytest.raises(ed.UnsupportedOpError, match="_efficientzerotensor"):
            F.silu(dual) * 2
