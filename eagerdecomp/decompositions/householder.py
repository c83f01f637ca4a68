"""Householder QR in LAPACK's own convention, written in core ops.

NOTE: geqrf, orgqr (householder_product) and ormqr have no decomposition in PyTorch. This is
LAPACK's unblocked dgeqr2 over the whole batch, one column per step (masked full-size
updates, no data value read, so each size traces once): the reflector of column i is the one
dlarfg forms, beta = -sign(alpha) * ||(alpha, x)||, tau = (beta - alpha) / beta,
v = (1, x / (alpha - beta)), and tau = 0 (H = I) where x is zero; H = I - tau v v^T is applied
to the columns after i. The factorization is unique given that convention, so R, the
reflectors and tau agree with LAPACK's blocked geqrf to rounding (not merely up to signs).
Q is accumulated backwards (H_0 (H_1 (... H_{k-1} E))), as dorg2r does; ormqr applies the
reflectors in the order its side and transpose call for. Complex inputs are declined.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.linalg import _FLOATS, _arange, fortran_out
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


def _mT(A):
    return aten.transpose.int(A, -2, -1)


def _geqr2(A):
    """``(a, tau)`` as geqrf returns them, for a batch of (m, n) matrices."""
    m, n = A.shape[-2], A.shape[-1]
    batch = list(A.shape[:-2])
    r, c = _arange(m, A), _arange(n, A)
    taus = []
    for i in range(min(m, n)):
        col = aten.select.int(A, -1, i)  # [..., m]
        alpha = aten.select.int(col, -1, i)  # [...]
        x = aten.where.self(aten.gt.Scalar(r, i), col, aten.zeros_like.default(col))
        xnorm = aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(x, x), [-1]))
        zero = aten.eq.Scalar(xnorm, 0)
        size = aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(alpha, alpha), aten.mul.Tensor(xnorm, xnorm)))
        beta = aten.where.self(aten.ge.Scalar(alpha, 0), aten.neg.default(size), size)
        beta = aten.where.self(zero, alpha, beta)
        safe_beta = aten.where.self(zero, aten.ones_like.default(beta), beta)
        tau = aten.where.self(
            zero, aten.zeros_like.default(beta), aten.div.Tensor(aten.sub.Tensor(beta, alpha), safe_beta)
        )
        gap = aten.where.self(zero, aten.ones_like.default(beta), aten.sub.Tensor(alpha, beta))
        below = aten.mul.Tensor(
            x, aten.unsqueeze.default(aten.reciprocal.default(gap), -1)
        )  # dscal by 1/(alpha - beta)
        v = aten.where.self(aten.eq.Scalar(r, i), aten.ones_like.default(col), below)  # zero above i (x is)
        # H applied to the columns after i: A -= tau v (v^T A)
        w = aten.matmul.default(aten.unsqueeze.default(v, -2), A)  # [..., 1, n]
        w = aten.where.self(aten.gt.Scalar(c, i), w, aten.zeros_like.default(w))
        update = aten.mul.Tensor(aten.unsqueeze.default(aten.mul.Tensor(v, aten.unsqueeze.default(tau, -1)), -1), w)
        A = aten.sub.Tensor(A, update)
        newcol = aten.where.self(
            aten.eq.Scalar(r, i), aten.unsqueeze.default(beta, -1), aten.where.self(aten.gt.Scalar(r, i), below, col)
        )
        A = aten.where.self(aten.eq.Scalar(c, i), aten.unsqueeze.default(newcol, -1), A)
        taus.append(aten.unsqueeze.default(tau, -1))
    tau = aten.cat.default(taus, -1) if taus else aten.full.default([*batch, 0], 0, dtype=A.dtype, device=A.device)
    return A, tau


def _reflector(V, i):
    """v_i of the compact form: 1 at row i, V's column i below it, 0 above."""
    r = _arange(V.shape[-2], V)
    col = aten.select.int(V, -1, i)
    return aten.where.self(
        aten.eq.Scalar(r, i),
        aten.ones_like.default(col),
        aten.where.self(aten.gt.Scalar(r, i), col, aten.zeros_like.default(col)),
    )


def _apply_left(C, v, tau):
    """``H C`` with ``H = I - tau v v^T``."""
    w = aten.matmul.default(aten.unsqueeze.default(v, -2), C)  # [..., 1, k]
    return aten.sub.Tensor(
        C, aten.mul.Tensor(aten.unsqueeze.default(aten.mul.Tensor(v, aten.unsqueeze.default(tau, -1)), -1), w)
    )


def _apply_right(C, v, tau):
    """``C H``."""
    w = aten.matmul.default(C, aten.unsqueeze.default(v, -1))  # [..., m, 1]
    return aten.sub.Tensor(
        C,
        aten.mul.Tensor(
            aten.mul.Tensor(w, aten.unsqueeze.default(aten.unsqueeze.default(tau, -1), -1)),
            aten.unsqueeze.default(v, -2),
        ),
    )


def _orgqr(V, tau, ncols):
    """The first ``ncols`` columns of ``H_0 ... H_{k-1}`` (m x m), accumulated backwards."""
    m = V.shape[-2]
    batch = list(V.shape[:-2])
    Q = aten.expand.default(aten.eye.m(m, ncols, dtype=V.dtype, device=V.device), [*batch, m, ncols])
    for i in range(tau.shape[-1] - 1, -1, -1):
        Q = _apply_left(Q, _reflector(V, i), aten.select.int(tau, -1, i))
    return aten.clone.default(Q) if tau.shape[-1] == 0 else Q


def _real(*ts):
    return all(t.dtype in _FLOATS and t.dtype == ts[0].dtype for t in ts) and ts[0].dim() >= 2


@project_decomposition(aten.geqrf.default)
def geqrf(A):
    if not _real(A):
        return NotImplemented
    return _geqr2(A)


@project_decomposition(aten.linalg_householder_product.default)
def linalg_householder_product(V, tau):
    m, n = V.shape[-2], V.shape[-1]
    if not _real(V, tau) or tau.shape[:-1] != V.shape[:-2] or not (m >= n >= tau.shape[-1]):
        return NotImplemented
    return _orgqr(V, tau, n)


@project_decomposition(aten.ormqr.default)
def ormqr(V, tau, C, left=True, transpose=False):
    if not _real(V, tau, C) or V.shape[:-2] != C.shape[:-2] or tau.shape[:-1] != V.shape[:-2]:
        return NotImplemented
    k = tau.shape[-1]
    if V.shape[-2] != (C.shape[-2] if left else C.shape[-1]) or k > V.shape[-2] or k > V.shape[-1]:
        return NotImplemented
    # left: Q C = H_0 (... (H_{k-1} C)), Q^T C = H_{k-1} (... (H_0 C)); right: C Q = ((C H_0) ...) H_{k-1}
    forward = left == transpose
    apply = _apply_left if left else _apply_right
    for i in range(k) if forward else range(k - 1, -1, -1):
        C = apply(C, _reflector(V, i), aten.select.int(tau, -1, i))
    return aten.clone.default(C) if k == 0 else C


@project_decomposition(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if not _real(A) or mode not in ("reduced", "complete", "r"):
        return NotImplemented
    m, n = A.shape[-2], A.shape[-1]
    k = min(m, n)
    a, tau = _geqr2(A)
    R = aten.triu.default(aten.slice.Tensor(a, -2, 0, m if mode == "complete" else k))
    if mode == "r":
        return aten.full.default([0], 0, dtype=A.dtype, device=A.device), R
    return _orgqr(a, tau, m if mode == "complete" else k), R


fortran_out(aten.linalg_householder_product.out, aten.linalg_householder_product.default, (True,))
fortran_out(aten.ormqr.out, aten.ormqr.default, (True,))
fortran_out(aten.linalg_qr.out, aten.linalg_qr.default, (True, True))


# NOTE: geqrf's out= form is declined: its meta kernel leaves the outs unresized (eager resizes
# them), so a trace checked against it cannot be eager's.
@project_decomposition(aten.geqrf.a)
def geqrf_out(*args, **kwargs):
    return NotImplemented
