"""Dense linear algebra by batched algorithms written in core ops.

NOTE: LAPACK's factorizations have no decomposition in PyTorch. LU here is Gaussian
elimination with partial pivoting, one column per step over the whole batch (masked
full-size updates, no data value read, so each size traces once): the pivot is the
first row of largest magnitude, as LAPACK's idamax picks it, and every row swap moves
the whole row, L part included, as getrf applies its interchanges. A zero pivot leaves
its column unscaled and is reported in ``info`` (1-based), as getrf does. The
factorization agrees with LAPACK's to rounding (LAPACK blocks and reorders the same
arithmetic): these are approximations under the conformance accuracy rule, and
results are as accurate as LAPACK's for well-conditioned input. Determinants come from
the diagonal of U and the parity of the swaps; lu_solve and inv run forward and back
substitution on the factors.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.overlap import guard
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten

_FLOATS = (torch.float32, torch.float64)


def _arange(n, like):
    return aten.arange.default(n, device=like.device)


def _lu(A):
    """``(LU, pivots int32 1-based, sign of the permutation, info int32)`` of a batch of
    (m, n) matrices: min(m, n) steps, getrf's pivots and info."""
    m, n = A.shape[-2], A.shape[-1]
    batch = list(A.shape[:-2])
    idx, cidx = _arange(m, A), _arange(n, A)
    pivots, sign = [], aten.full.default(batch, 1, dtype=A.dtype, device=A.device)
    info = aten.full.default(batch, 0, dtype=torch.int32, device=A.device)
    rows = aten.unsqueeze.default(idx, 1)
    cols = aten.unsqueeze.default(cidx, 0)
    for k in range(min(m, n)):
        column = aten.abs.default(aten.select.int(A, -1, k))  # [..., m]
        column = aten.where.self(aten.lt.Scalar(idx, k), aten.full_like.default(column, -1), column)
        p = aten.argmax.default(column, -1, True)  # [..., 1]: the first largest, rows >= k
        swap = aten.where.self(
            aten.eq.Scalar(idx, k), p, aten.where.self(aten.eq.Tensor(idx, p), aten.full_like.default(p, k), idx)
        )
        A = aten.gather.default(A, -2, aten.expand.default(aten.unsqueeze.default(swap, -1), [*batch, m, n]))
        pivots.append(aten.add.Tensor(p, 1))
        sign = aten.where.self(aten.squeeze.dim(aten.eq.Scalar(p, k), -1), sign, aten.neg.default(sign))
        pivot = aten.select.int(aten.select.int(A, -1, k), -1, k)  # [...]
        zero = aten.eq.Scalar(pivot, 0)
        info = aten.where.self(
            aten.logical_and.default(zero, aten.eq.Scalar(info, 0)), aten.full_like.default(info, k + 1), info
        )
        below = aten.gt.Scalar(idx, k)
        l = aten.div.Tensor(
            aten.select.int(A, -1, k),
            aten.unsqueeze.default(aten.where.self(zero, aten.ones_like.default(pivot), pivot), -1),
        )
        l = aten.where.self(
            aten.logical_and.default(below, aten.logical_not.default(aten.unsqueeze.default(zero, -1))),
            l,
            aten.zeros_like.default(l),
        )
        urow = aten.select.int(A, -2, k)
        u = aten.where.self(aten.gt.Scalar(cidx, k), urow, aten.zeros_like.default(urow))
        A = aten.sub.Tensor(A, aten.mul.Tensor(aten.unsqueeze.default(l, -1), aten.unsqueeze.default(u, -2)))
        keep_l = aten.logical_and.default(aten.eq.Scalar(cols, k), aten.gt.Scalar(rows, k))
        A = aten.where.self(
            aten.logical_and.default(keep_l, aten.logical_not.default(aten.view.default(zero, [*batch, 1, 1]))),
            aten.unsqueeze.default(l, -1),
            A,
        )
    piv = (
        aten._to_copy.default(aten.cat.default(pivots, -1), dtype=torch.int32)
        if pivots
        else aten.full.default([*batch, 0], 0, dtype=torch.int32, device=A.device)
    )
    return A, piv, sign, info


def _diag(LU):
    return aten.diagonal.default(LU, 0, -2, -1)


def _square(A):
    return A.dim() >= 2 and A.shape[-1] == A.shape[-2] and A.dtype in _FLOATS


def _as_eager_factors(A):
    """The matrix eager factors: A^T when A is contiguous (det(A^T) = det(A), and LAPACK wants
    column-major input), else A. The LU it returns is of that matrix."""
    return aten.transpose.int(A, -2, -1) if A.is_contiguous() else A


@project_decomposition(aten._linalg_det.default)
def linalg_det(A):
    if not _square(A):
        return NotImplemented
    LU, piv, sign, _ = _lu(_as_eager_factors(A))
    det = aten.mul.Tensor(aten.prod.dim_int(_diag(LU), -1), sign) if A.shape[-1] else sign
    return det, LU, piv


@project_decomposition(aten._linalg_slogdet.default)
def linalg_slogdet(A):
    if not _square(A):
        return NotImplemented
    LU, piv, sign, _ = _lu(_as_eager_factors(A))
    d = _diag(LU)
    sgn = aten.mul.Tensor(aten.prod.dim_int(aten.sign.default(d), -1), sign) if A.shape[-1] else sign
    logabs = aten.sum.dim_IntList(aten.log.default(aten.abs.default(d)), [-1])
    return sgn, logabs, LU, piv


@project_decomposition(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    # NOTE: eager has no unpivoted LU on the CPU (it raises): declined
    if A.dim() < 2 or A.dtype not in _FLOATS or not pivot:
        return NotImplemented
    LU, piv, _, info = _lu(A)
    if check_errors:  # reads info (the bypass path): the LU is given eager's strides here
        aten._linalg_check_errors.default(info, "torch.linalg.lu_factor_ex", is_matrix=A.dim() == 2)
        LU = aten.transpose.int(
            aten.clone.default(aten.transpose.int(LU, -2, -1), memory_format=torch.contiguous_format), -2, -1
        )
    return LU, piv, info


def _permutation(piv, m, like):
    """``P`` (dtype of ``like``) with ``A = P L U`` for getrf's 1-based row swaps ``piv``."""
    batch = list(piv.shape[:-1])
    order = _apply_pivots(aten.unsqueeze.default(aten.expand.default(_arange(m, like), [*batch, m]), -1), piv)
    order = aten.squeeze.dim(order, -1)  # row j of P^T A is row order[j] of A
    P = aten.eq.Tensor(aten.unsqueeze.default(_arange(m, like), -1), aten.unsqueeze.default(order, -2))
    return aten._to_copy.default(P, dtype=like.dtype)


def _unpack(LU, piv, unpack_data=True, unpack_pivots=True):
    m, n = LU.shape[-2], LU.shape[-1]
    k = min(m, n)

    def empty():
        return aten.full.default([0], 0, dtype=LU.dtype, device=LU.device)

    P = _permutation(piv, m, LU) if unpack_pivots else empty()
    if not unpack_data:
        return P, empty(), empty()
    L = aten.tril.default(aten.slice.Tensor(LU, -1, 0, k), -1)
    L = aten.add.Tensor(L, aten.eye.m(m, k, dtype=LU.dtype, device=LU.device))
    U = aten.triu.default(aten.slice.Tensor(LU, -2, 0, k))
    return P, L, U


@project_decomposition(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    # NOTE: P, L and U from getrf's compact form: L is the strict lower part plus the unit
    # diagonal, U the upper part, P the row swaps applied in order to the identity.
    if LU_data.dim() < 2 or LU_data.dtype not in _FLOATS or LU_pivots.shape[:-1] != LU_data.shape[:-2]:
        return NotImplemented
    if LU_pivots.shape[-1] != min(LU_data.shape[-2:]) or LU_pivots.dtype != torch.int32:
        return NotImplemented
    return _unpack(LU_data, LU_pivots, unpack_data, unpack_pivots)


@project_decomposition(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    if A.dim() < 2 or A.dtype not in _FLOATS or not pivot:
        return NotImplemented
    LU, piv, _, _ = _lu(A)
    return _unpack(LU, piv)


def _apply_pivots(B, piv):
    """``P^T B``: the row swaps of ``piv`` (1-based, in order) applied to ``B``."""
    n = B.shape[-2]
    idx = _arange(n, B)
    batch = list(B.shape[:-2])
    for k in range(piv.shape[-1]):
        p = aten.sub.Tensor(aten._to_copy.default(aten.slice.Tensor(piv, -1, k, k + 1), dtype=torch.int64), 1)
        swap = aten.where.self(
            aten.eq.Scalar(idx, k), p, aten.where.self(aten.eq.Tensor(idx, p), aten.full_like.default(p, k), idx)
        )
        B = aten.gather.default(B, -2, aten.expand.default(aten.unsqueeze.default(swap, -1), [*batch, n, B.shape[-1]]))
    return B


def _substitute(LU, B, lower, unit=None):
    """Solve ``T X = B`` for the lower or upper triangle ``T`` of ``LU`` by substitution, row by
    row; its diagonal is taken as ones when ``unit`` (default: the lower triangle, L of an LU)."""
    unit = lower if unit is None else unit
    n = LU.shape[-1]
    idx = _arange(n, LU)
    X = aten.zeros_like.default(B)
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        row = aten.select.int(LU, -2, i)  # [..., n]
        coeff = aten.where.self(
            aten.lt.Scalar(idx, i) if lower else aten.gt.Scalar(idx, i), row, aten.zeros_like.default(row)
        )
        acc = aten.squeeze.dim(aten.matmul.default(aten.unsqueeze.default(coeff, -2), X), -2)  # [..., k]
        x = aten.sub.Tensor(aten.select.int(B, -2, i), acc)
        if not unit:
            x = aten.div.Tensor(x, aten.unsqueeze.default(aten.select.int(row, -1, i), -1))
        X = aten.where.self(aten.unsqueeze.default(aten.eq.Scalar(idx, i), -1), aten.unsqueeze.default(x, -2), X)
    return X


def _unpivot(X, piv):
    """``P X``: the swaps of ``piv`` undone, last first."""
    n = X.shape[-2]
    idx = _arange(n, X)
    batch = list(X.shape[:-2])
    for k in range(piv.shape[-1] - 1, -1, -1):
        p = aten.sub.Tensor(aten._to_copy.default(aten.slice.Tensor(piv, -1, k, k + 1), dtype=torch.int64), 1)
        swap = aten.where.self(
            aten.eq.Scalar(idx, k), p, aten.where.self(aten.eq.Tensor(idx, p), aten.full_like.default(p, k), idx)
        )
        X = aten.gather.default(X, -2, aten.expand.default(aten.unsqueeze.default(swap, -1), [*batch, n, X.shape[-1]]))
    return X


def _lu_solve(LU, piv, B, adjoint=False):
    if not adjoint:  # A = P L U: X = U^-1 L^-1 P^T B
        return _substitute(LU, _substitute(LU, _apply_pivots(B, piv), lower=True), lower=False)
    # A^T = P L U, so A = U^T L^T P^T: X = P L^-T U^-T B
    LUt = aten.transpose.int(LU, -2, -1)
    Y = _substitute(LUt, B, lower=True, unit=False)
    return _unpivot(_substitute(LUt, Y, lower=False, unit=True), piv)


@project_decomposition(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    if LU.dtype not in _FLOATS or B.dtype != LU.dtype:
        return NotImplemented
    if not left:  # X A = B  <=>  A^T X^T = B^T
        B = aten.transpose.int(B, -2, -1)
        return aten.transpose.int(linalg_lu_solve(LU, pivots, B, left=True, adjoint=not adjoint), -2, -1)
    batch = list(torch.broadcast_shapes(LU.shape[:-2], B.shape[:-2]))
    LU = aten.expand.default(LU, [*batch, *LU.shape[-2:]])
    pivots = aten.expand.default(pivots, [*batch, pivots.shape[-1]])
    return _lu_solve(LU, pivots, aten.expand.default(B, [*batch, *B.shape[-2:]]), adjoint)


def _vector_rhs(A, B):
    return B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])


@project_decomposition(aten._linalg_solve_ex.default)
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    # NOTE: eager (torch 2.13) factors A itself, whatever its layout, and returns that LU and
    # pivots (its backward solves with them, adjoint=True); the solve broadcasts the batches.
    # An earlier version of this decomposition factored A^T for contiguous A, as older eager did: its forward values
    # matched but the gradients, computed from the returned LU, did not.
    if not _square(A) or B.dtype != A.dtype or B.dim() < 1:
        return NotImplemented
    vector = _vector_rhs(A, B)
    Bm = aten.unsqueeze.default(B, -1 if left else -2) if vector else B
    LU, piv, _, info = _lu(A)
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    X = linalg_lu_solve(LU, piv, Bm, left=left)
    X = aten.squeeze.dim(X, -1 if left else -2) if vector else X
    if check_errors:  # the bypass path: eager's strides given here
        LU = aten.transpose.int(
            aten.clone.default(aten.transpose.int(LU, -2, -1), memory_format=torch.contiguous_format), -2, -1
        )
        if left and not vector:
            X = aten.transpose.int(
                aten.clone.default(aten.transpose.int(X, -2, -1), memory_format=torch.contiguous_format), -2, -1
            )
    return X, LU, piv, info


@project_decomposition(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    # NOTE: eager factors A itself here (not A^T as solve_ex does), so a singular input reports
    # the same zero pivot in info; linalg.inv raises from it (eager's own check, below)
    if not _square(A) or check_errors:
        return NotImplemented
    LU, piv, _, info = _lu(A)
    eye = aten.expand.default(aten.eye.default(A.shape[-1], dtype=A.dtype, device=A.device), list(A.shape))
    return _lu_solve(LU, piv, eye), info


# NOTE: the linalg wrappers (inv, solve, cholesky, lu_factor...) raise from the info their
# factorization returns; reading it is a data value (the bypass path). Eager's messages,
# chosen by the API name as _linalg_check_errors does.
_LinAlg = torch.linalg.LinAlgError
_SINGULAR = (  # (API name contains, error type, message)
    (
        "inv",
        _LinAlg,
        "The diagonal element {info} is zero, the inversion could not be completed because the input matrix is singular.",  # noqa: E501 (eager's message, kept greppable)
    ),
    ("solve", _LinAlg, "The solver failed because the input matrix is singular."),
    (
        "cholesky",
        _LinAlg,
        "The factorization could not be completed because the input is not positive-definite (the leading minor of order {info} is not positive-definite).",  # noqa: E501 (eager's message, kept greppable)
    ),
    (
        "lu_factor",
        RuntimeError,
        "U[{info},{info}] is zero and using it on lu_solve would result in a division by zero. If you still want to perform the factorization, consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)",  # noqa: E501 (eager's message, kept greppable)
    ),
)


@project_decomposition(aten._linalg_check_errors.default)
def linalg_check_errors(info, api_name, *, is_matrix):
    if info.numel() == 0:
        return None
    flat = aten.view.default(aten.clone.default(info, memory_format=torch.contiguous_format), [-1])
    failed = [int(v) for v in flat.tolist()]
    bad = next((i for i, v in enumerate(failed) if v != 0), None)
    if bad is None:
        return None
    code = failed[bad]
    where = "" if is_matrix else f": (Batch element {bad})"
    for key, error, message in _SINGULAR:
        if key in api_name and code > 0:
            raise error(f"{api_name}{where}: {message.format(info=code)}")
    return NotImplemented  # another API or a negative code: eager's own wording is not reproduced


def _fortran_strides(shape):
    """Batched column-major strides (LAPACK's layout) of ``shape``."""
    *batch, m, n = shape
    strides, step = [1, max(m, 1)], max(m, 1) * max(n, 1)
    for size in reversed(batch):
        strides.insert(0, step)
        step *= max(size, 1)
    return strides


def fortran_out(op, functional, fortran):
    """Register the out= form of a LAPACK-style ``op``.

    NOTE: eager resizes an out whose shape differs to batched column-major strides (for the
    outputs flagged in ``fortran``, a tuple or a function of the arguments; pivots and info stay
    row-major) and keeps the strides of one
    whose shape is right, copying the result in; the generic out= rule resizes row-major.
    """
    names = [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info and a.alias_info.is_write]

    def fill(*args, **kwargs):
        outs = [kwargs.pop(name) for name in names]
        guard(op, functional, outs, [args, list(kwargs.values())])
        result = functional(*args, **kwargs)
        result = result if isinstance(result, (tuple, list)) else (result,)
        if len(result) != len(outs) or any(o.dtype != r.dtype or o.device != r.device for o, r in zip(outs, result)):
            return NotImplemented
        flags = fortran(*args, **kwargs) if callable(fortran) else fortran
        for out, res, f in zip(outs, result, flags):
            if out.shape != res.shape:
                resize_out(out, res.shape)
                if f and res.dim() >= 2:
                    aten.as_strided_.default(
                        out, list(res.shape), _fortran_strides(list(res.shape)), out.storage_offset()
                    )
            aten.copy_.default(out, res)
        return outs[0] if len(outs) == 1 else tuple(outs)

    project_decomposition(op)(fill)


fortran_out(aten.linalg_inv_ex.inverse, aten.linalg_inv_ex.default, (True, False))
fortran_out(
    aten._linalg_solve_ex.result, aten._linalg_solve_ex.default, lambda A, B, left=True, **k: (left, True, False, False)
)
fortran_out(aten.linalg_lu_factor_ex.out, aten.linalg_lu_factor_ex.default, (True, False, False))
# a right solve is the transpose of a left one: its result, and a resized out, are row-major
fortran_out(aten.linalg_lu_solve.out, aten.linalg_lu_solve.default, lambda *a, left=True, **k: (left,))
