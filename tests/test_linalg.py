"""Linear algebra written in core ops (eagerdecomp/linalg.py) against LAPACK's answers and errors."""

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _matrices(dtype):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 5, 5, dtype=dtype, generator=g)
    S = A.clone()
    S[:, 2] = S[:, 1]  # singular, its zero pivots left to rounding
    Z = A.clone()
    Z[1:, 3] = 0  # batch elements 1 and 2 singular with an exactly zero pivot
    return A, S, Z, torch.randn(3, 5, 2, dtype=dtype, generator=g)


def _both(fn, *args):
    want = fn(*args)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = fn(*args)
    rec.assert_only("core_aten")
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    return want, got


CALLS = {
    "det": lambda A, S, Z, B: (torch.linalg.det, A),
    "det column-major": lambda A, S, Z, B: (torch.linalg.det, A.mT.contiguous().mT),
    "det singular": lambda A, S, Z, B: (torch.linalg.det, S),
    "det zero pivot": lambda A, S, Z, B: (torch.linalg.det, Z),
    "_linalg_det": lambda A, S, Z, B: (torch.ops.aten._linalg_det, A),
    "slogdet": lambda A, S, Z, B: (torch.linalg.slogdet, A),
    "lu_factor_ex": lambda A, S, Z, B: (torch.linalg.lu_factor_ex, A),
    "inv": lambda A, S, Z, B: (torch.linalg.inv, A),
    "lu_solve": lambda A, S, Z, B: (torch.linalg.lu_solve, *torch.linalg.lu_factor(A), B),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_matches_lapack(dtype, name):
    fn, *args = CALLS[name](*_matrices(dtype))
    want, got = _both(fn, *args)
    for w, g in zip(want, got):
        assert (w.dtype, w.shape, w.stride()) == (g.dtype, g.shape, g.stride())
        torch.testing.assert_close(g, w, **TOL[dtype]) if w.is_floating_point() else torch.testing.assert_close(g, w)


ERRORS = {
    "inv": torch.linalg.inv,
    "lu_factor": torch.linalg.lu_factor,
}


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("name", list(ERRORS))
def test_singular_input_raises_eagers_error(name, batched):
    _, _, Z, _ = _matrices(torch.float64)
    M = Z if batched else Z[1]
    with pytest.raises(RuntimeError) as want:
        ERRORS[name](M)
    with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError) as got:
        ERRORS[name](M)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_det_gradient():
    A = _matrices(torch.float64)[0]
    want = torch.autograd.grad(torch.linalg.det(A.requires_grad_()).sum(), A)[0]
    with ed.EagerDecompMode("core_aten"):
        got = torch.autograd.grad(torch.linalg.det(A).sum(), A)[0]
    torch.testing.assert_close(got, want, **TOL[torch.float64])
