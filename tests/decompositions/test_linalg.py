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


def _exact_meta(want, got):
    for w, g in zip(want, got):
        assert (w.dtype, w.shape) == (g.dtype, g.shape)
        significant = [(a, b) for size, a, b in zip(w.shape, w.stride(), g.stride()) if size > 1]
        assert w.numel() <= 1 or all(a == b for a, b in significant), (w.stride(), g.stride())


def _more(dtype):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 4, 4, dtype=dtype, generator=g)
    P = X @ X.mT + torch.eye(4, dtype=dtype)  # positive definite
    L = torch.linalg.cholesky(P)
    T = torch.randn(4, 4, dtype=dtype, generator=g) + 4 * torch.eye(4, dtype=dtype)  # well-conditioned triangles
    B = torch.randn(3, 4, 2, dtype=dtype, generator=g)
    N = P.clone()
    N[1, 2, 2] -= 100  # batch element 1 not positive-definite (leading minor 3)
    R = torch.randn(2, 5, 3, dtype=dtype, generator=g)
    return dict(P=P, L=L, T=T, B=B, N=N, R=R, W=R.mT.contiguous())


def _out(fn, *shapes):
    def call(*args):
        outs = tuple(torch.empty(0, dtype=d) for d in shapes)
        fn(*args, out=outs if len(outs) > 1 else outs[0])
        return outs

    return call


MORE = {
    "cholesky": lambda m: (torch.linalg.cholesky, m["P"]),
    "cholesky upper": lambda m: (lambda A: torch.linalg.cholesky(A, upper=True), m["P"]),
    "cholesky_ex not PD": lambda m: (torch.linalg.cholesky_ex, m["N"]),
    "cholesky_ex not PD upper": lambda m: (lambda A: torch.linalg.cholesky_ex(A, upper=True), m["N"]),
    "cholesky_ex out": lambda m: (_out(torch.linalg.cholesky_ex, m["P"].dtype, torch.int32), m["P"]),
    "torch.cholesky": lambda m: (torch.cholesky, m["P"]),
    "solve_triangular": lambda m: (lambda A, B: torch.linalg.solve_triangular(A, B, upper=True), m["T"], m["B"]),
    "solve_triangular unit lower": lambda m: (
        lambda A, B: torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True),
        m["T"],
        m["B"],
    ),
    "solve_triangular right": lambda m: (
        lambda A, B: torch.linalg.solve_triangular(A, B.mT, upper=True, left=False),
        m["T"],
        m["B"],
    ),
    "solve_triangular out": lambda m: (
        _out(lambda A, B, out: torch.linalg.solve_triangular(A, B, upper=False, out=out), m["T"].dtype),
        m["T"],
        m["B"],
    ),
    "triangular_solve": lambda m: (torch.triangular_solve, m["B"], m["T"]),
    "triangular_solve transpose": lambda m: (
        lambda B, A: torch.triangular_solve(B, A, upper=False, transpose=True),
        m["B"],
        m["T"],
    ),
    "cholesky_solve": lambda m: (torch.cholesky_solve, m["B"], m["L"]),
    "cholesky_solve upper": lambda m: (lambda B, U: torch.cholesky_solve(B, U, upper=True), m["B"], m["L"].mT),
    "cholesky_inverse": lambda m: (torch.cholesky_inverse, m["L"]),
    "cholesky_inverse upper": lambda m: (lambda U: torch.cholesky_inverse(U, upper=True), m["L"].mT),
    "lu_factor tall": lambda m: (torch.linalg.lu_factor_ex, m["R"]),
    "lu_factor wide": lambda m: (torch.linalg.lu_factor_ex, m["W"]),
    "lu_factor out": lambda m: (_out(torch.linalg.lu_factor_ex, m["R"].dtype, torch.int32, torch.int32), m["P"]),
    "linalg.lu tall": lambda m: (torch.linalg.lu, m["R"]),
    "linalg.lu wide": lambda m: (torch.linalg.lu, m["W"]),
    "lu_unpack": lambda m: (torch.lu_unpack, *torch.linalg.lu_factor(m["R"])),
    "lu_unpack pivots only": lambda m: (
        lambda LU, p: torch.lu_unpack(LU, p, unpack_data=False),
        *torch.linalg.lu_factor(m["W"]),
    ),
    "lu_solve right adjoint": lambda m: (
        lambda LU, p, B: torch.linalg.lu_solve(LU, p, B.mT, left=False, adjoint=True),
        *torch.linalg.lu_factor(m["P"]),
        m["B"],
    ),
    "lu_solve right out": lambda m: (
        _out(lambda LU, p, B, out: torch.linalg.lu_solve(LU, p, B.mT, left=False, out=out), m["P"].dtype),
        *torch.linalg.lu_factor(m["P"]),
        m["B"],
    ),
    "inv out": lambda m: (_out(torch.linalg.inv_ex, m["P"].dtype, torch.int32), m["P"]),
    "geqrf tall": lambda m: (torch.geqrf, m["R"]),
    "geqrf wide": lambda m: (torch.geqrf, m["W"]),
    "qr reduced": lambda m: (torch.linalg.qr, m["R"]),
    "qr complete": lambda m: (lambda A: torch.linalg.qr(A, mode="complete"), m["R"]),
    "qr r wide": lambda m: (lambda A: torch.linalg.qr(A, mode="r"), m["W"]),
    "qr out": lambda m: (_out(torch.linalg.qr, m["R"].dtype, m["R"].dtype), m["R"]),
    "householder_product": lambda m: (torch.linalg.householder_product, *torch.geqrf(m["R"])),
    "ormqr": lambda m: (torch.ormqr, *torch.geqrf(m["R"]), m["R"][..., :2]),
    "ormqr right transpose": lambda m: (
        lambda a, t, C: torch.ormqr(a, t, C, left=False, transpose=True),
        *torch.geqrf(m["R"]),
        m["R"].mT,
    ),
    "solve": lambda m: (torch.linalg.solve, m["P"], m["B"]),
    "solve vector": lambda m: (torch.linalg.solve, m["P"], m["B"][..., 0]),
    "solve right": lambda m: (lambda A, B: torch.linalg.solve(A, B.mT, left=False), m["P"], m["B"]),
    "solve_ex": lambda m: (torch.linalg.solve_ex, m["P"].mT, m["B"]),
    "solve out": lambda m: (_out(torch.linalg.solve, m["P"].dtype), m["P"], m["B"]),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(MORE))
def test_factorizations_match_lapack(dtype, name):
    fn, *args = MORE[name](_more(dtype))
    want, got = _both(fn, *args)
    _exact_meta(want, got)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, **TOL[dtype]) if w.is_floating_point() else torch.testing.assert_close(g, w)


def test_cholesky_failure_leaves_dpotf2s_partial_factor():
    # NOTE: what MKL leaves for a non-positive-definite input (columns after the failing
    # pivot as in the input, the failing pivot's value in place), at a few sizes up to 128
    g = torch.Generator().manual_seed(2)
    for n, bad in ((3, 1), (9, 4), (33, 32)):
        X = torch.randn(n, n, dtype=torch.float64, generator=g)
        A = X @ X.mT + torch.eye(n, dtype=torch.float64)
        A[bad, bad] -= 1000
        want, got = _both(torch.linalg.cholesky_ex, A)
        assert got[1] == want[1] == bad + 1
        torch.testing.assert_close(got[0], want[0], **TOL[torch.float64])


def test_empty_and_batch_shapes():
    for shape in [(0, 3, 3), (2, 0, 0), (3, 3)]:
        P = torch.eye(3, dtype=torch.float64).expand(shape) if shape[-1] else torch.zeros(shape, dtype=torch.float64)
        for fn in (torch.linalg.cholesky_ex, torch.linalg.lu_factor_ex, torch.linalg.lu, torch.cholesky_inverse):
            want, got = _both(fn, P)
            _exact_meta(want, got)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "name,fn",
    [
        ("linalg.cholesky", torch.linalg.cholesky),
        ("cholesky", torch.cholesky),
        ("cholesky_ex", lambda A: torch.linalg.cholesky_ex(A, check_errors=True)),
        ("lu_factor_ex", lambda A: torch.linalg.lu_factor_ex(A - A, check_errors=True)),
    ],
)
@pytest.mark.parametrize("batched", [True, False])
def test_not_positive_definite_raises_eagers_error(name, fn, batched):
    N = _more(torch.float64)["N"]
    M = N if batched else N[1]
    with pytest.raises(RuntimeError) as want:
        fn(M)
    with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError) as got:
        fn(M)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_solve_gradient():
    # NOTE: eager's backward solves with the LU _linalg_solve_ex returns: it must be A's own
    A, B = _more(torch.float64)["P"], _more(torch.float64)["B"]
    want = torch.autograd.grad(torch.linalg.solve(A.requires_grad_(), B).sum(), A)[0]
    with ed.EagerDecompMode("core_aten"):
        got = torch.autograd.grad(torch.linalg.solve(A, B).sum(), A)[0]
    torch.testing.assert_close(got, want, **TOL[torch.float64])


@pytest.mark.parametrize("scale", [1e-12, 1e-3, 0.1, 1.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp(dtype, scale):
    # every degree eager picks, and scaling and squaring; float32 is held to the conformance
    # accuracy rule (error against float64 no worse than eager's), float64 to LAPACK's level
    g = torch.Generator().manual_seed(3)
    A = torch.randn(3, 4, 4, dtype=torch.float64, generator=g) * scale / 4
    A[1] *= 0.01  # another degree in the same batch
    A = A.to(dtype)
    (want,), (got,) = _both(torch.linalg.matrix_exp, A)
    _exact_meta((want,), (got,))
    ref = torch.linalg.matrix_exp(A.double())
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    else:
        assert ((got.double() - ref).abs() <= 2 * (want.double() - ref).abs() + 1e-6 * ref.abs() + 1e-30).all()


def test_matrix_exp_declines_what_it_cannot_match():
    huge = torch.tensor([[0.0, 1e300], [0.0, 0.0]], dtype=torch.float64)  # eager's 2^s overflows int64
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError):
        torch.linalg.matrix_exp(huge)
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError):
        torch.linalg.matrix_exp(torch.eye(3, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_ldl_bunch_kaufman(dtype, n):
    # small diagonals force 2x2 pivots and interchanges; a non-symmetric input is read from
    # its lower triangle, as sytrf reads it
    g = torch.Generator().manual_seed(n)
    A = torch.randn(4, n, n, dtype=dtype, generator=g)
    A[:2] = A[:2] + A[:2].mT
    A[0].diagonal().mul_(0.01)
    want, got = _both(torch.linalg.ldl_factor_ex, A)
    _exact_meta(want, got)
    for w, g_ in zip(want, got):
        torch.testing.assert_close(g_, w, **TOL[dtype]) if w.is_floating_point() else torch.testing.assert_close(g_, w)
    B = torch.randn(4, n, 3, dtype=dtype, generator=g)
    want, got = _both(torch.linalg.ldl_solve, *want[:2], B)
    _exact_meta(want, got)
    torch.testing.assert_close(got[0], want[0], **TOL[dtype])


def test_ldl_zero_column_sets_info():
    Z = torch.zeros(2, 3, 3, dtype=torch.float64)
    Z[0] = torch.eye(3)
    want, got = _both(torch.linalg.ldl_factor_ex, Z)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelss", "gelsd"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 3), (2, 4), (2, 5, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstsq_full_rank(dtype, shape, driver):
    # each driver's outputs (residuals, rank, singular values) as eager gives them; float32 is
    # computed in float64, so it is held to the accuracy rule against a float64 run
    g = torch.Generator().manual_seed(4)
    A = torch.randn(*shape, dtype=dtype, generator=g)
    B = torch.randn(*shape[:-1], 2, dtype=dtype, generator=g)
    want, got = _both(lambda A, B: torch.linalg.lstsq(A, B, driver=driver), A, B)
    _exact_meta(want, got)
    ref = torch.linalg.lstsq(A.double(), B.double(), driver=driver)
    for w, g_, r in zip(want, got, ref):
        if not w.is_floating_point():
            torch.testing.assert_close(g_, w)
        elif dtype == torch.float64:
            torch.testing.assert_close(g_, w, **TOL[dtype])
        else:
            assert ((g_.double() - r).abs() <= 2 * (w.double() - r).abs() + 1e-6 * r.abs() + 1e-6).all()


def test_lstsq_declines_rank_deficient_input():
    A = torch.randn(4, 3, dtype=torch.float64)
    A[:, 2] = A[:, 0]
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError):
        torch.linalg.lstsq(A, torch.randn(4, 2, dtype=torch.float64))


PINV = {
    "full rank": lambda A: torch.linalg.pinv(A),
    "wide": lambda A: torch.linalg.pinv(A.mT),
    "rtol 1 keeps nothing": lambda A: torch.linalg.pinv(A, rtol=1.0),
    "atol tensor": lambda A: torch.linalg.pinv(A, atol=torch.tensor(0.1, dtype=torch.float64)),
    "hermitian": lambda A: torch.linalg.pinv(A[..., :3, :] @ A[..., :3, :].mT - 1, hermitian=True),
    "pinverse": lambda A: torch.pinverse(A),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(PINV))
def test_pinv(dtype, name):
    g = torch.Generator().manual_seed(5)
    A = torch.randn(2, 5, 3, dtype=dtype, generator=g)
    want, got = _both(PINV[name], A)
    _exact_meta(want, got)
    ref = PINV[name](A.double())
    if dtype == torch.float64:
        torch.testing.assert_close(got[0], want[0], **TOL[dtype])
    else:  # computed in float64: held to the accuracy rule
        assert ((got[0].double() - ref).abs() <= 2 * (want[0].double() - ref).abs() + 1e-6 * ref.abs() + 1e-6).all()


def test_pinv_declines_singular_values_at_the_cutoff():
    a = torch.linalg.qr(torch.randn(3, 1, dtype=torch.float64))[0]
    with ed.EagerDecompMode("core_aten"), pytest.raises(ed.UnsupportedOpError):
        torch.linalg.pinv(a @ a.mT)  # two singular values at rounding level, the cutoff 3 eps


def test_pinv_of_a_large_rank_one_matrix_rotates_pairs_in_parallel():
    # the OpInfo's "singular" samples (a 50 x 1 times 1 x 50 product): with one rotation per column
    # pair a sweep was 49,000 kernel calls, minutes under the mode; disjoint pairs rotate together
    g = torch.Generator().manual_seed(3)
    A = torch.randn(50, 1, dtype=torch.float64, generator=g) @ torch.randn(1, 50, dtype=torch.float64, generator=g)
    want, got = _both(torch.linalg.pinv, A)
    torch.testing.assert_close(got[0], want[0], **TOL[torch.float64])
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        torch.linalg.pinv(A)
    assert sum(rec.ops.values()) < 40_000, sum(rec.ops.values())
