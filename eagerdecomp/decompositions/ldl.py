"""LDL^T with Bunch-Kaufman pivoting (sytrf/sytrs, lower triangle), written in core ops.

NOTE: linalg_ldl_factor_ex and linalg_ldl_solve have no decomposition in PyTorch. The
factorization is LAPACK's unblocked dsytf2 (uplo='L'), whose pivots and compact form eager
returns: at column k, alpha = (1 + sqrt(17)) / 8, a 1x1 pivot without interchange if
|a_kk| >= alpha * colmax (or >= alpha * colmax^2 / rowmax), a 1x1 pivot with row/column imax
if |a_imax,imax| >= alpha * rowmax, else a 2x2 pivot with imax swapped into k+1; pivots are
1-based, a 2x2 block's two entries both -(imax+1); a zero column sets ``info`` (1-based)
and is left as it is. Only the trailing block is interchanged (the L columns before it are
not), as dsytf2 does. Here the trailing block is kept as a full symmetric matrix
(re-mirrored from its lower triangle after each step, so every read is of the entry LAPACK
reads), one column per step over the whole batch: a batch element in the second column of
a 2x2 block skips that step (masked full-size updates, no data value read, so each size
traces once). The solve is dsytrs: L D, then L^T, with the interchanges in LAPACK's order.
Values agree with LAPACK's to rounding; a near-tie in a pivot test may be decided
differently by rounding, as in any reimplementation. Real dtypes only (hermitian is the
same factorization for them); complex inputs are declined.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.linalg import _FLOATS, _arange, fortran_out
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _swap_index(idx, a, b):
    """Index vector with positions ``a`` and ``b`` (each [..., 1]) exchanged."""
    return aten.where.self(aten.eq.Tensor(idx, a), b, aten.where.self(aten.eq.Tensor(idx, b), a, idx))


def _col(W, k):
    return aten.select.int(W, -1, k)


def _at(v, k):
    return aten.select.int(v, -1, k)


def _sytf2(A):
    n = A.shape[-1]
    batch = list(A.shape[:-2])
    idx = _arange(n, A)
    rows, cols = aten.unsqueeze.default(idx, -1), aten.unsqueeze.default(idx, 0)
    lower = aten.ge.Tensor(rows, cols)
    W = aten.where.self(lower, A, aten.transpose.int(A, -2, -1))  # symmetric from the lower triangle
    zero_b = aten.full.default(batch, False, dtype=torch.bool, device=A.device)
    info = aten.full.default(batch, 0, dtype=torch.int32, device=A.device)
    skip, pending = zero_b, aten.full.default(batch, 0, dtype=torch.int64, device=A.device)
    pivots = []

    def bview(t):
        return aten.view.default(t, [*batch, 1, 1])

    for k in range(n):
        active = aten.logical_not.default(skip)
        col = aten.abs.default(_col(W, k))
        absakk = _at(col, k)
        masked = aten.where.self(aten.gt.Scalar(idx, k), col, aten.full_like.default(col, -1.0))
        if k < n - 1:
            imax = aten.argmax.default(masked, -1, True)  # [..., 1]: the first largest below k
            colmax = aten.squeeze.dim(aten.gather.default(col, -1, imax), -1)
        else:
            imax = aten.full.default([*batch, 1], k, dtype=torch.int64, device=A.device)
            colmax = aten.zeros_like.default(absakk)
        zero = aten.logical_or.default(
            aten.eq.Scalar(aten.maximum.default(absakk, colmax), 0), aten.isnan.default(absakk)
        )
        row = aten.abs.default(
            aten.squeeze.dim(
                aten.gather.default(W, -2, aten.expand.default(aten.unsqueeze.default(imax, -1), [*batch, 1, n])), -2
            )
        )
        off = aten.logical_and.default(aten.ge.Scalar(idx, k), aten.ne.Tensor(idx, imax))
        rowmax = aten.amax.default(aten.where.self(off, row, aten.zeros_like.default(row)), [-1])
        diag_imax = aten.squeeze.dim(
            aten.gather.default(aten.abs.default(aten.diagonal.default(W, 0, -2, -1)), -1, imax), -1
        )
        acol = aten.mul.Scalar(colmax, _ALPHA)
        no_swap = aten.logical_or.default(
            aten.ge.Tensor(absakk, acol), aten.ge.Tensor(absakk, aten.mul.Tensor(acol, aten.div.Tensor(colmax, rowmax)))
        )
        one_swap = aten.ge.Tensor(diag_imax, aten.mul.Scalar(rowmax, _ALPHA))
        no_swap = aten.logical_or.default(no_swap, zero)
        two = aten.logical_and.default(active, aten.logical_not.default(aten.logical_or.default(no_swap, one_swap)))
        kk = aten.add.Tensor(aten.unsqueeze.default(aten._to_copy.default(two, dtype=torch.int64), -1), k)
        kp = aten.where.self(aten.unsqueeze.default(no_swap, -1), kk, imax)
        kp = aten.where.self(aten.unsqueeze.default(active, -1), kp, kk)
        # symmetric interchange of kk and kp inside the trailing block (rows and columns >= k)
        p = _swap_index(idx, kk, kp)
        G = aten.gather.default(W, -2, aten.expand.default(aten.unsqueeze.default(p, -1), [*batch, n, n]))
        G = aten.gather.default(G, -1, aten.expand.default(aten.unsqueeze.default(p, -2), [*batch, n, n]))
        trailing = aten.logical_and.default(aten.ge.Scalar(rows, k), aten.ge.Scalar(cols, k))
        W = aten.where.self(trailing, G, W)
        update = aten.logical_and.default(active, aten.logical_not.default(zero))
        one = aten.logical_and.default(update, aten.logical_not.default(two))
        # 1x1: A22 -= x (d11 x)^T, L column = d11 x
        d11 = aten.reciprocal.default(aten.where.self(one, _at(_col(W, k), k), aten.ones_like.default(absakk)))
        x = aten.where.self(aten.gt.Scalar(idx, k), _col(W, k), aten.zeros_like.default(idx, dtype=A.dtype))
        dx = aten.mul.Tensor(x, aten.unsqueeze.default(d11, -1))
        W1 = aten.sub.Tensor(W, aten.mul.Tensor(aten.unsqueeze.default(x, -1), aten.unsqueeze.default(dx, -2)))
        W1 = aten.where.self(aten.logical_and.default(aten.gt.Scalar(rows, k), aten.gt.Scalar(cols, k)), W1, W)
        W1 = aten.where.self(
            aten.logical_and.default(aten.eq.Scalar(cols, k), aten.gt.Scalar(rows, k)),
            aten.unsqueeze.default(dx, -1),
            W1,
        )
        if k < n - 1:  # 2x2 on columns k, k+1
            c0, c1 = _col(W, k), _col(W, k + 1)
            d21 = _at(c0, k + 1)
            d21s = aten.where.self(two, d21, aten.ones_like.default(d21))
            e11 = aten.div.Tensor(_at(c1, k + 1), d21s)
            e22 = aten.div.Tensor(_at(c0, k), d21s)
            t = aten.reciprocal.default(aten.sub.Scalar(aten.mul.Tensor(e11, e22), 1))
            f21 = aten.unsqueeze.default(aten.div.Tensor(t, d21s), -1)
            e11, e22 = aten.unsqueeze.default(e11, -1), aten.unsqueeze.default(e22, -1)
            below = aten.gt.Scalar(idx, k + 1)
            a0 = aten.where.self(below, c0, aten.zeros_like.default(c0))
            a1 = aten.where.self(below, c1, aten.zeros_like.default(c1))
            wk = aten.mul.Tensor(f21, aten.sub.Tensor(aten.mul.Tensor(e11, a0), a1))
            wkp1 = aten.mul.Tensor(f21, aten.sub.Tensor(aten.mul.Tensor(e22, a1), a0))
            W2 = aten.sub.Tensor(
                aten.sub.Tensor(W, aten.mul.Tensor(aten.unsqueeze.default(a0, -1), aten.unsqueeze.default(wk, -2))),
                aten.mul.Tensor(aten.unsqueeze.default(a1, -1), aten.unsqueeze.default(wkp1, -2)),
            )
            W2 = aten.where.self(
                aten.logical_and.default(aten.gt.Scalar(rows, k + 1), aten.gt.Scalar(cols, k + 1)), W2, W
            )
            W2 = aten.where.self(
                aten.logical_and.default(aten.eq.Scalar(cols, k), aten.gt.Scalar(rows, k + 1)),
                aten.unsqueeze.default(wk, -1),
                W2,
            )
            W2 = aten.where.self(
                aten.logical_and.default(aten.eq.Scalar(cols, k + 1), aten.gt.Scalar(rows, k + 1)),
                aten.unsqueeze.default(wkp1, -1),
                W2,
            )
            W = aten.where.self(bview(two), W2, aten.where.self(bview(one), W1, W))
        else:
            W = aten.where.self(bview(one), W1, W)
        W = aten.where.self(lower, W, aten.transpose.int(W, -2, -1))  # re-mirror the lower triangle
        kp1 = aten.add.Scalar(aten.squeeze.dim(kp, -1), 1)
        piv = aten.where.self(two, aten.neg.default(kp1), kp1)
        pivots.append(aten.where.self(skip, pending, piv))
        info = aten.where.self(
            aten.logical_and.default(aten.logical_and.default(active, zero), aten.eq.Scalar(info, 0)),
            aten.full_like.default(info, k + 1),
            info,
        )
        pending, skip = aten.neg.default(kp1), two
    piv = (
        aten._to_copy.default(aten.stack.default(pivots, -1), dtype=torch.int32)
        if n
        else aten.full.default([*batch, 0], 0, dtype=torch.int32, device=A.device)
    )
    return aten.tril.default(W), piv, info


@project_decomposition(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(A, *, hermitian=False, check_errors=False):
    if A.dim() < 2 or A.shape[-1] != A.shape[-2] or A.dtype not in _FLOATS:
        return NotImplemented
    LD, piv, info = _sytf2(A)
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.ldl_factor_ex", is_matrix=A.dim() == 2)
        LD = aten.transpose.int(
            aten.clone.default(aten.transpose.int(LD, -2, -1), memory_format=torch.contiguous_format), -2, -1
        )
    return LD, piv, info


def _swap_rows(B, a, b):
    n = B.shape[-2]
    p = _swap_index(_arange(n, B), a, b)
    return aten.gather.default(B, -2, aten.expand.default(aten.unsqueeze.default(p, -1), list(B.shape)))


def _sytrs(LD, piv, B):
    n = LD.shape[-1]
    batch = list(B.shape[:-2])
    idx = _arange(n, B)
    piv = aten._to_copy.default(piv, dtype=torch.int64)
    neg = aten.lt.Scalar(piv, 0)
    first, prev = [], aten.full.default(batch, False, dtype=torch.bool, device=B.device)
    for k in range(n):  # the first column of each 2x2 block
        prev = aten.logical_and.default(_at(neg, k), aten.logical_not.default(prev))
        first.append(prev)

    def bview(t):
        return aten.view.default(t, [*batch, 1, 1])

    def rowv(t):  # [...] -> [..., 1, 1]
        return bview(t)

    def minus_col(B, k, rows_from, src):  # B[i] -= L[i, k] * B[src] for i >= rows_from
        l = aten.where.self(aten.ge.Scalar(idx, rows_from), _col(LD, k), aten.zeros_like.default(_col(LD, k)))
        return aten.sub.Tensor(
            B, aten.mul.Tensor(aten.unsqueeze.default(l, -1), aten.unsqueeze.default(aten.select.int(B, -2, src), -2))
        )

    def put_row(B, k, row, mask):
        return aten.where.self(
            aten.logical_and.default(aten.unsqueeze.default(aten.eq.Scalar(idx, k), -1), bview(mask)),
            aten.unsqueeze.default(row, -2),
            B,
        )

    for k in range(n):  # L D Y = P^T B
        kp = aten.sub.Scalar(aten.abs.default(aten.slice.Tensor(piv, -1, k, k + 1)), 1)  # [..., 1]
        one = aten.logical_not.default(_at(neg, k))
        two = first[k]
        B1 = _swap_rows(B, aten.full_like.default(kp, k), kp)
        B1 = minus_col(B1, k, k + 1, k)
        B1 = put_row(
            B1,
            k,
            aten.mul.Tensor(
                aten.select.int(B1, -2, k), aten.unsqueeze.default(aten.reciprocal.default(_at(_col(LD, k), k)), -1)
            ),
            one,
        )
        if k < n - 1:
            B2 = _swap_rows(B, aten.full_like.default(kp, k + 1), kp)
            B2 = minus_col(B2, k, k + 2, k)
            B2 = minus_col(B2, k + 1, k + 2, k + 1)
            akm1k = _at(_col(LD, k), k + 1)
            akm1k = aten.where.self(two, akm1k, aten.ones_like.default(akm1k))
            akm1 = aten.div.Tensor(_at(_col(LD, k), k), akm1k)
            ak = aten.div.Tensor(_at(_col(LD, k + 1), k + 1), akm1k)
            denom = aten.unsqueeze.default(aten.sub.Scalar(aten.mul.Tensor(akm1, ak), 1), -1)
            bkm1 = aten.div.Tensor(aten.select.int(B2, -2, k), aten.unsqueeze.default(akm1k, -1))
            bk = aten.div.Tensor(aten.select.int(B2, -2, k + 1), aten.unsqueeze.default(akm1k, -1))
            top = aten.div.Tensor(aten.sub.Tensor(aten.mul.Tensor(aten.unsqueeze.default(ak, -1), bkm1), bk), denom)
            bot = aten.div.Tensor(aten.sub.Tensor(aten.mul.Tensor(aten.unsqueeze.default(akm1, -1), bk), bkm1), denom)
            B2 = put_row(put_row(B2, k, top, two), k + 1, bot, two)
            B = aten.where.self(bview(two), B2, B)
        B = aten.where.self(bview(one), B1, B)
    for k in range(n - 1, -1, -1):  # L^T X = Y, then the interchanges
        kp = aten.sub.Scalar(aten.abs.default(aten.slice.Tensor(piv, -1, k, k + 1)), 1)
        one = aten.logical_not.default(_at(neg, k))
        second = aten.logical_and.default(_at(neg, k), aten.logical_not.default(first[k]))
        below = aten.gt.Scalar(idx, k)

        def dot(B, c):  # sum over i > k of L[i, c] B[i]
            l = aten.where.self(below, _col(LD, c), aten.zeros_like.default(_col(LD, c)))
            return aten.squeeze.dim(aten.matmul.default(aten.unsqueeze.default(l, -2), B), -2)

        Bk = put_row(B, k, aten.sub.Tensor(aten.select.int(B, -2, k), dot(B, k)), aten.logical_or.default(one, second))
        if k > 0:
            Bk = put_row(Bk, k - 1, aten.sub.Tensor(aten.select.int(B, -2, k - 1), dot(B, k - 1)), second)
        Bk = _swap_rows(Bk, aten.full_like.default(kp, k), kp)
        B = aten.where.self(bview(aten.logical_or.default(one, second)), Bk, B)
    return B


@project_decomposition(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    if LD.dim() < 2 or LD.dtype not in _FLOATS or B.dtype != LD.dtype or B.dim() < 2:
        return NotImplemented
    batch = list(torch.broadcast_shapes(LD.shape[:-2], pivots.shape[:-1], B.shape[:-2]))
    LD = aten.expand.default(LD, [*batch, *LD.shape[-2:]])
    pivots = aten.expand.default(pivots, [*batch, pivots.shape[-1]])
    return _sytrs(LD, pivots, aten.expand.default(B, [*batch, *B.shape[-2:]]))


fortran_out(aten.linalg_ldl_factor_ex.out, aten.linalg_ldl_factor_ex.default, (True, False, False))
fortran_out(aten.linalg_ldl_solve.out, aten.linalg_ldl_solve.default, (True,))
