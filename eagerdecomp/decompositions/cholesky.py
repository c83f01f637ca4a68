"""Triangular solves and the Cholesky family, written in core ops.

NOTE: LAPACK's trsm/potrf/potrs/potri have no decomposition in PyTorch. A triangular solve
here is substitution, one row per step over the whole batch (linalg._substitute: masked
full-size updates, no data value read, so each size traces once); only the triangle LAPACK
reads is read. Cholesky is LAPACK's unblocked dpotf2 (left-looking: column j from the
finished columns before it, its diagonal's square root, the rest scaled): a non-positive
(or NaN) pivot stops the factorization with ``info`` = j+1 (1-based), leaves that pivot's
value in place and the columns after it as they were in the input, as dpotf2 does and as
MKL's potrf leaves them up to n = 128 (measured); past that MKL blocks, so a larger failing
input is declined (the decomposition reads ``info``, the bypass path). Values agree with LAPACK's to
rounding (the conformance accuracy rule). Complex inputs are declined (conjugation).
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.linalg import _FLOATS, _arange, _substitute, fortran_out
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_MKL_UNBLOCKED = 128  # largest n whose failing potrf MKL leaves as dpotf2 does (measured)


def _bcast(A, B):
    batch = list(torch.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    return aten.expand.default(A, [*batch, *A.shape[-2:]]), aten.expand.default(B, [*batch, *B.shape[-2:]])


def _mT(A):
    return aten.transpose.int(A, -2, -1)


def _fortran(X):
    """``X`` in LAPACK's batched column-major layout, eager's strides for these outputs (the
    bypass path, taken when a decomposition reads ``info``, is not restrided to the meta kernel's)."""
    return _mT(aten.clone.default(_mT(X), memory_format=torch.contiguous_format))


def _real_square(A, *others):
    ok = A.dim() >= 2 and A.shape[-1] == A.shape[-2] and A.dtype in _FLOATS
    return ok and all(o.dtype == A.dtype and o.dim() >= 2 for o in others)


def _tri_solve(T, B, upper, unit=False):
    """``X`` with ``T X = B``, ``T`` the upper or lower triangle of ``T`` (batches broadcast)."""
    T, B = _bcast(T, B)
    return _substitute(T, B, lower=not upper, unit=unit)


@project_decomposition(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    if not _real_square(A, B):
        return NotImplemented
    if left:
        return _tri_solve(A, B, upper, unitriangular)
    # X A = B  <=>  A^T X^T = B^T, and A^T's triangle is the other one
    return _mT(_tri_solve(_mT(A), _mT(B), not upper, unitriangular))


@project_decomposition(aten.triangular_solve.default)
def triangular_solve(B, A, upper=True, transpose=False, unitriangular=False):
    if not _real_square(A, B):
        return NotImplemented
    A, B = _bcast(A, B)
    X = _tri_solve(_mT(A), B, not upper, unitriangular) if transpose else _tri_solve(A, B, upper, unitriangular)
    return X, aten.clone.default(A)


def _potf2(A):
    """``(L, info)``: dpotf2 on the lower triangle of a batch of square matrices."""
    n = A.shape[-1]
    batch = list(A.shape[:-2])
    idx = _arange(n, A)
    L = A
    info = aten.full.default(batch, 0, dtype=torch.int32, device=A.device)
    failed = aten.full.default(batch, False, dtype=torch.bool, device=A.device)
    for j in range(n):
        row = aten.select.int(L, -2, j)  # [..., n]: L[j, :j] finished
        row = aten.where.self(aten.lt.Scalar(idx, j), row, aten.zeros_like.default(row))
        acc = aten.squeeze.dim(aten.matmul.default(L, aten.unsqueeze.default(row, -1)), -1)  # L[:, :j] @ L[j, :j]
        col = aten.sub.Tensor(aten.select.int(L, -1, j), acc)
        ajj = aten.select.int(col, -1, j)  # [...]
        bad = aten.logical_not.default(aten.gt.Scalar(ajj, 0))  # NaN too
        newly = aten.logical_and.default(bad, aten.logical_not.default(failed))
        ok = aten.logical_not.default(aten.logical_or.default(bad, failed))
        root = aten.sqrt.default(aten.where.self(ok, ajj, aten.ones_like.default(ajj)))
        done = aten.where.self(
            aten.gt.Scalar(idx, j),
            aten.div.Tensor(col, aten.unsqueeze.default(root, -1)),
            aten.unsqueeze.default(root, -1),
        )
        old = aten.select.int(L, -1, j)
        stop = aten.where.self(aten.eq.Scalar(idx, j), col, old)  # the failing pivot keeps its value
        new = aten.where.self(
            aten.unsqueeze.default(ok, -1), done, aten.where.self(aten.unsqueeze.default(newly, -1), stop, old)
        )
        new = aten.where.self(aten.lt.Scalar(idx, j), old, new)
        L = aten.where.self(aten.eq.Scalar(idx, j), aten.unsqueeze.default(new, -1), L)
        info = aten.where.self(newly, aten.full_like.default(info, j + 1), info)
        failed = aten.logical_or.default(failed, bad)
    return aten.tril.default(L), info


def _cholesky(A, upper):
    """``(L or U, info)``; None where a failing input is past what dpotf2 describes."""
    L, info = _potf2(_mT(A) if upper else A)
    if A.shape[-1] > _MKL_UNBLOCKED and aten._local_scalar_dense.default(aten.any.default(aten.ne.Scalar(info, 0))):
        return None
    return (_mT(L) if upper else L), info


@project_decomposition(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(A, *, upper=False, check_errors=False):
    if not _real_square(A):
        return NotImplemented
    got = _cholesky(A, upper)
    if got is None:
        return NotImplemented
    if check_errors:
        aten._linalg_check_errors.default(got[1], "linalg.cholesky_ex", is_matrix=A.dim() == 2)
    return _fortran(got[0]), got[1]


@project_decomposition(aten.cholesky.default)
def cholesky(A, upper=False):
    if not _real_square(A):
        return NotImplemented
    got = _cholesky(A, upper)
    if got is None:
        return NotImplemented
    aten._linalg_check_errors.default(got[1], "cholesky", is_matrix=A.dim() == 2)
    return _fortran(got[0])


def _chol_solve(B, L, upper):
    if upper:  # A = U^T U
        return _tri_solve(L, _tri_solve(_mT(L), B, upper=False), upper=True)
    return _tri_solve(_mT(L), _tri_solve(L, B, upper=False), upper=True)  # A = L L^T


@project_decomposition([aten.cholesky_solve.default, aten._cholesky_solve_helper.default])
def cholesky_solve(B, L, upper=False):
    if not _real_square(L, B):
        return NotImplemented
    return _chol_solve(B, L, upper)


@project_decomposition(aten.cholesky_inverse.default)
def cholesky_inverse(L, upper=False):
    # NOTE: potri computes one triangle of inv(L)^T inv(L) and eager mirrors it: the result
    # is exactly symmetric, so the lower triangle is mirrored here too.
    if not _real_square(L):
        return NotImplemented
    n = L.shape[-1]
    eye = aten.expand.default(aten.eye.default(n, dtype=L.dtype, device=L.device), list(L.shape))
    if upper:  # A^-1 = U^-1 U^-T
        Ui = _tri_solve(L, eye, upper=True)
        X = aten.matmul.default(Ui, _mT(Ui))
    else:  # A^-1 = L^-T L^-1
        Li = _tri_solve(L, eye, upper=False)
        X = aten.matmul.default(_mT(Li), Li)
    idx = _arange(n, L)
    lower = aten.ge.Tensor(aten.unsqueeze.default(idx, 1), aten.unsqueeze.default(idx, 0))
    return aten.where.self(lower, X, _mT(X))


fortran_out(aten.linalg_solve_triangular.out, aten.linalg_solve_triangular.default, (True,))
fortran_out(aten.triangular_solve.X, aten.triangular_solve.default, (True, True))
fortran_out(aten.linalg_cholesky_ex.L, aten.linalg_cholesky_ex.default, (True, False))
fortran_out(aten.cholesky_inverse.out, aten.cholesky_inverse.default, (True,))
