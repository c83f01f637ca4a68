"""Least squares (linalg.lstsq) for full-rank input and the pseudo-inverse (linalg.pinv),
written in core ops.

NOTE: linalg_lstsq has no decomposition in PyTorch. For a matrix of full rank the answer
of every driver is the same unique vector (least squares for m >= n, least norm for m < n),
so it is computed one way, in float64 and rounded once: Householder QR of A (m >= n; x from
R x = Q^T B) or of A^T (m < n; x = Q R^-T B), as gels does. What the drivers add is eager's
bookkeeping: gels returns the residuals (m > n) and no rank; gelsy the rank and no
residuals; gelss/gelsd the rank, the singular values and the residuals (m > n, full rank).
Singular values come from one-sided Jacobi sweeps (Hestenes), run to convergence: they are
unique and Jacobi is at least as accurate as LAPACK's SVD. Whether A has full rank in the
driver's eyes is a data question, read here (the bypass path): a call is declined unless
every matrix's smallest singular value exceeds 8 x rcond x the largest (rcond defaults to
eps x max(m, n), as in eager), far from any threshold the drivers apply (gelsy's condition
estimate never exceeds the true condition number; gels fails only on an exactly singular R).
Rank-deficient, empty, non-finite, vector right-hand side and complex calls are declined.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.householder import _apply_left, _geqr2, _reflector
from eagerdecomp.decompositions.linalg import _FLOATS, _fortran_strides, _substitute
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.overlap import guard
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten

_DRIVERS = ("gels", "gelsy", "gelss", "gelsd")
_EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.float64: torch.finfo(torch.float64).eps}


def _mT(A):
    return aten.transpose.int(A, -2, -1)


def _jacobi(A, max_sweeps=60):
    """One-sided Jacobi (Hestenes) on a float64 batch with m >= n: ``(W, V)``, A V = W with
    orthogonal columns; None if the sweeps do not converge. Reads data (convergence): for the
    bypass path only.

    NOTE: the rotations of a sweep run n / 2 at a time, on disjoint column pairs (the round-robin
    ordering: position i meets position N - 1 - i, then positions 1..N-1 shift by one, so N - 1
    rounds meet every pair once and leave the columns in their first order). A sweep is then
    about 35 ops per round instead of 40 per pair: a 50 x 50 pinv made 49,000 calls a sweep and
    took minutes under the mode. An odd n gets a zero column, which no rotation touches.
    """
    m, n = A.shape[-2], A.shape[-1]
    N = n + n % 2
    h = N // 2
    tol = torch.finfo(torch.float64).eps
    V = aten.expand.default(aten.eye.default(N, dtype=A.dtype, device=A.device), [*A.shape[:-2], N, N])
    U = (
        A
        if N == n
        else aten.cat.default([A, aten.zeros.default([*A.shape[:-1], 1], dtype=A.dtype, device=A.device)], -1)
    )
    X = aten.cat.default([U, V], -2)  # rotated together: U's rows above, V's below
    for _ in range(max_sweeps):
        worst = aten.zeros.default([], dtype=A.dtype, device=A.device)
        for _ in range(N - 1):
            P = aten.slice.Tensor(X, -1, 0, h)
            Q = aten.flip.default(aten.slice.Tensor(X, -1, h, N), [-1])
            up, uq = aten.slice.Tensor(P, -2, 0, m), aten.slice.Tensor(Q, -2, 0, m)
            a = aten.sum.dim_IntList(aten.mul.Tensor(up, up), [-2])
            b = aten.sum.dim_IntList(aten.mul.Tensor(uq, uq), [-2])
            g = aten.sum.dim_IntList(aten.mul.Tensor(up, uq), [-2])
            scale = aten.sqrt.default(aten.mul.Tensor(a, b))
            rotate = aten.gt.Tensor(aten.abs.default(g), aten.mul.Scalar(scale, tol))
            ratio = aten.where.self(rotate, aten.div.Tensor(aten.abs.default(g), scale), aten.zeros_like.default(g))
            if ratio.numel():
                worst = aten.maximum.default(worst, aten.max.default(ratio))
            gs = aten.where.self(rotate, g, aten.ones_like.default(g))
            zeta = aten.div.Tensor(aten.sub.Tensor(b, a), aten.mul.Scalar(gs, 2.0))
            sign = aten.where.self(
                aten.ge.Scalar(zeta, 0), aten.ones_like.default(zeta), aten.full_like.default(zeta, -1.0)
            )
            t = aten.div.Tensor(
                sign,
                aten.add.Tensor(
                    aten.abs.default(zeta), aten.sqrt.default(aten.add.Scalar(aten.mul.Tensor(zeta, zeta), 1.0))
                ),
            )
            t = aten.where.self(rotate, t, aten.zeros_like.default(t))
            c = aten.unsqueeze.default(aten.rsqrt.default(aten.add.Scalar(aten.mul.Tensor(t, t), 1.0)), -2)
            s = aten.mul.Tensor(c, aten.unsqueeze.default(t, -2))
            P, Q = (
                aten.sub.Tensor(aten.mul.Tensor(c, P), aten.mul.Tensor(s, Q)),
                aten.add.Tensor(aten.mul.Tensor(s, P), aten.mul.Tensor(c, Q)),
            )
            X = aten.cat.default([P, aten.flip.default(Q, [-1])], -1)
            if N > 2:  # the next round's pairs: position 1 takes N - 1's column, the rest move up one
                X = aten.cat.default(
                    [
                        aten.slice.Tensor(X, -1, 0, 1),
                        aten.slice.Tensor(X, -1, N - 1, N),
                        aten.slice.Tensor(X, -1, 1, N - 1),
                    ],
                    -1,
                )
        if float(aten._local_scalar_dense.default(worst)) <= tol:  # one read per sweep
            W, V = aten.slice.Tensor(X, -2, 0, m), aten.slice.Tensor(X, -2, m, m + N)
            return aten.slice.Tensor(W, -1, 0, n), aten.slice.Tensor(aten.slice.Tensor(V, -2, 0, n), -1, 0, n)
    return None


def singular_values(A):
    """Singular values (descending) of a float64 batch, or None (see :func:`_jacobi`)."""
    got = _jacobi(_mT(A) if A.shape[-2] < A.shape[-1] else A)
    if got is None:
        return None
    norms = aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(got[0], got[0]), [-2]))
    return aten.sort.default(norms, -1, True)[0]


def _full_rank_solve(A, B):
    """``(X, Q^T B rows past n or None)`` for full-rank float64 A, B (batches equal)."""
    m, n = A.shape[-2], A.shape[-1]
    if m >= n:
        a, tau = _geqr2(A)
        C = B
        for i in range(n):  # Q^T B = H_{n-1} ... H_0 B
            C = _apply_left(C, _reflector(a, i), aten.select.int(tau, -1, i))
        R = aten.slice.Tensor(aten.slice.Tensor(a, -2, 0, n), -1, 0, n)
        X = _substitute(R, aten.slice.Tensor(C, -2, 0, n), lower=False, unit=False)
        return X, aten.slice.Tensor(C, -2, n, m)
    a, tau = _geqr2(_mT(A))  # A^T = Q R, A = R^T Q^T: x = Q (R^-T B; 0)
    R = aten.slice.Tensor(aten.slice.Tensor(a, -2, 0, m), -1, 0, m)
    Y = _substitute(_mT(R), B, lower=True, unit=False)
    shape = list(Y.shape)
    shape[-2] = n - m
    X = aten.cat.default([Y, aten.zeros.default(shape, dtype=Y.dtype, device=Y.device)], -2)
    for i in range(m - 1, -1, -1):  # Q X = H_0 (... (H_{m-1} X))
        X = _apply_left(X, _reflector(a, i), aten.select.int(tau, -1, i))
    return X, None


@project_decomposition(aten.linalg_lstsq.default)
def linalg_lstsq(A, B, rcond=None, *, driver=None):
    driver = "gelsy" if driver is None else driver
    if A.dtype not in _FLOATS or B.dtype != A.dtype or driver not in _DRIVERS or A.dim() < 2 or B.dim() != A.dim():
        return NotImplemented
    m, n = A.shape[-2], A.shape[-1]
    if A.numel() == 0 or B.numel() == 0 or B.shape[-2] != m:
        return NotImplemented
    batch = list(torch.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    k = B.shape[-1]
    A64 = aten._to_copy.default(aten.expand.default(A, [*batch, m, n]), dtype=torch.float64)
    B64 = aten._to_copy.default(aten.expand.default(B, [*batch, m, k]), dtype=torch.float64)
    if not aten._local_scalar_dense.default(aten.all.default(aten.isfinite.default(A64))):
        return NotImplemented
    s = singular_values(A64)
    if s is None:
        return NotImplemented
    if rcond is not None and rcond < 0:
        return NotImplemented  # LAPACK's own default (eps) then, not eager's
    rcond = _EPS[A.dtype] * max(m, n) if rcond is None else rcond
    smax, smin = aten.select.int(s, -1, 0), aten.select.int(s, -1, -1)
    if not aten._local_scalar_dense.default(aten.all.default(aten.gt.Tensor(smin, aten.mul.Scalar(smax, 8.0 * rcond)))):
        return NotImplemented  # rank-deficient or near a driver's threshold
    X, rest = _full_rank_solve(A64, B64)
    # eager's solution is the first n rows of LAPACK's column-major max(m, n) x k buffer
    buf = aten.cat.default([X, rest], -2) if m > n else X
    buf = _mT(aten.clone.default(_mT(aten._to_copy.default(buf, dtype=A.dtype)), memory_format=torch.contiguous_format))
    X = aten.slice.Tensor(buf, -2, 0, n)

    def empty(dtype):
        return aten.full.default([0], 0, dtype=dtype, device=A.device)

    residuals = empty(A.dtype)
    if m > n and driver != "gelsy":
        residuals = aten._to_copy.default(aten.sum.dim_IntList(aten.mul.Tensor(rest, rest), [-2]), dtype=A.dtype)
    rank = (
        empty(torch.int64)
        if driver == "gels"
        else aten.full.default(batch, min(m, n), dtype=torch.int64, device=A.device)
    )
    svals = aten._to_copy.default(s, dtype=A.dtype) if driver in ("gelss", "gelsd") else empty(A.dtype)
    return X, residuals, rank, svals


@project_decomposition(aten.linalg_lstsq.out)
def linalg_lstsq_out(A, B, rcond=None, *, driver=None, solution, residuals, rank, singular_values):
    # NOTE: eager resizes a solution out of another shape to LAPACK's column-major
    # max(m, n) x k buffer and hands back its first n rows (a view with that buffer's strides)
    outs = (solution, residuals, rank, singular_values)
    guard(aten.linalg_lstsq.out, aten.linalg_lstsq.default, list(outs), [A, B])
    result = linalg_lstsq(A, B, rcond, driver=driver)
    if result is NotImplemented or any(o.dtype != r.dtype for o, r in zip(outs, result)):
        return NotImplemented
    X = result[0]
    if solution.shape != X.shape:
        rows = max(A.shape[-2], A.shape[-1])
        full = [*X.shape[:-2], rows, X.shape[-1]]
        resize_out(solution, full)
        aten.as_strided_.default(solution, list(X.shape), _fortran_strides(full), solution.storage_offset())
    aten.copy_.default(solution, X)
    for out, res in zip(outs[1:], result[1:]):
        resize_out(out, res.shape)
        aten.copy_.default(out, res)
    return outs


# NOTE: pinv is unique once the rank is fixed: eager keeps the singular values above
# tol = max(atol, rtol * s_max) (rtol defaulting to eps * max(m, n), or 0 when atol > 0) and
# returns V diag(1/s) U^T (hermitian: from the lower triangle, |eigenvalues| being the singular
# values). The same sum is computed here from one-sided Jacobi in float64 and rounded once; it
# does not depend on the signs of the singular vectors. Which singular values a rounding-level
# SVD puts above tol is not shown to match eager's, so a call is declined (read here: the
# bypass path) when any singular value lies within max(tol/2, 4 eps s_max) of tol, unless
# rtol >= 1 (then none is kept by either, exactly).
@project_decomposition(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(A, *, atol=None, rtol=None, hermitian=False):
    if A.dtype not in _FLOATS or A.dim() < 2 or (hermitian and A.shape[-1] != A.shape[-2]):
        return NotImplemented
    m, n = A.shape[-2], A.shape[-1]
    batch = list(A.shape[:-2])
    for t in (atol, rtol):
        if t is not None and (t.is_complex() or list(torch.broadcast_shapes(t.shape, batch)) != batch):
            return NotImplemented
    if A.numel() == 0:
        return aten.zeros.default([*batch, n, m], dtype=A.dtype, device=A.device)
    M = aten._to_copy.default(A, dtype=torch.float64)
    if hermitian:
        idx = aten.arange.default(n, device=A.device)
        low = aten.ge.Tensor(aten.unsqueeze.default(idx, -1), aten.unsqueeze.default(idx, 0))
        M = aten.where.self(low, M, _mT(M))
    if not aten._local_scalar_dense.default(aten.all.default(aten.isfinite.default(M))):
        return NotImplemented
    tall = m >= n
    got = _jacobi(M if tall else _mT(M))
    if got is None:
        return NotImplemented
    W, V = got
    s = aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(W, W), [-2]))  # [..., q]
    smax = aten.amax.default(s, [-1])
    zero = aten.zeros.default([], dtype=torch.float64, device=A.device)
    atol_t = zero if atol is None else aten._to_copy.default(atol, dtype=torch.float64)
    if rtol is not None:
        rtol_t = aten._to_copy.default(rtol, dtype=torch.float64)
    else:
        default = aten.full.default([], _EPS[A.dtype] * max(m, n), dtype=torch.float64, device=A.device)
        rtol_t = default if atol is None else aten.where.self(aten.gt.Scalar(atol_t, 0), zero, default)
    tol = aten.maximum.default(atol_t, aten.mul.Tensor(rtol_t, smax))  # [...]
    tol = aten.unsqueeze.default(aten.expand.default(tol, batch), -1)
    band = aten.maximum.default(
        aten.mul.Scalar(tol, 0.5), aten.unsqueeze.default(aten.mul.Scalar(smax, 4 * _EPS[A.dtype]), -1)
    )
    near = aten.lt.Tensor(aten.abs.default(aten.sub.Tensor(s, tol)), band)
    none_kept = aten.unsqueeze.default(aten.expand.default(aten.ge.Scalar(rtol_t, 1.0), batch), -1)
    if aten._local_scalar_dense.default(
        aten.any.default(aten.logical_and.default(near, aten.logical_not.default(none_kept)))
    ):
        return NotImplemented
    keep = aten.logical_and.default(aten.gt.Tensor(s, tol), aten.logical_not.default(none_kept))
    safe = aten.where.self(keep, s, aten.ones_like.default(s))
    inv = aten.where.self(keep, aten.reciprocal.default(safe), aten.zeros_like.default(s))
    U = aten.div.Tensor(W, aten.unsqueeze.default(safe, -2))
    P = aten.matmul.default(aten.mul.Tensor(V, aten.unsqueeze.default(inv, -2)), _mT(U))  # pinv of the tall one
    P = P if tall else _mT(P)
    return aten.clone.default(aten._to_copy.default(P, dtype=A.dtype), memory_format=torch.contiguous_format)
