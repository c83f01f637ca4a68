"""Matrix functions written in core ops: the matrix exponential.

NOTE: linalg_matrix_exp has no decomposition in PyTorch. Eager's kernel (mexp) picks, per
matrix, a Taylor polynomial of degree 1, 2, 4, 8 or 12 by the operator 1-norm against
thresholds theta_d (float32 and float64 have their own), and from theta_12 up scales by
2^-s, s = max(0, ceil(log2(norm / theta_18))), takes the degree-18 polynomial and squares it
s times; a NaN norm gives NaN. Here every candidate is computed over the whole batch from
shared powers of the scaled matrix (17 products) and the one eager picks is selected with
where, so no norm is read to choose a degree. The squarings are the one data-dependent
step, as they are in eager (it reads s on the CPU): the decomposition reads the largest s, so a call
takes the bypass path, and declines when s would overflow eager's 2^s (s > 62) or is not
finite. The polynomials are Taylor's, which eager's product schemes (Bader, Blanes, Casas)
evaluate to rounding. Every dtype is computed in float64 (float64's thresholds) and rounded
once: in float32 the s squarings amplify rounding differently from eager's and measured 4x
eager's error against a float64 reference at norm 100; in float64 the result is at least as
accurate as eager's (the conformance accuracy rule). 16-bit floats are declined: eager's
kernel returns NaN and inf for them (bfloat16, measured on ordinary inputs), which no
accurate method reproduces.
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten

_DEGREES = (1, 2, 4, 8, 12, 18)
_THETAS = {
    torch.float32: (
        1.192092800768788e-07,
        5.978858893805233e-04,
        5.116619363445086e-02,
        5.800524627688768e-01,
        1.461661507209034e00,
        3.010066362817634e00,
    ),
    torch.float64: (
        2.220446049250313e-16,
        2.580956802971767e-08,
        3.397168839976962e-04,
        4.991228871115323e-02,
        2.996158913811580e-01,
        1.090863719290036e00,
    ),
}
_MAX_SQUARINGS = 62  # eager's 2^s is an int64


def _mexp(A):
    thetas = _THETAS[A.dtype]
    n = A.shape[-1]
    norm = aten.amax.default(aten.sum.dim_IntList(aten.abs.default(A), [-2]), [-1])  # [...]: operator 1-norm
    large = aten.ge.Scalar(norm, thetas[4])  # eager's T18 path, taken last (it wins at equality)
    s = aten.ceil.default(aten.log2.default(aten.div.Scalar(norm, thetas[5])))
    s = aten.where.self(large, aten.clamp_min.default(s, 0), aten.zeros_like.default(s))
    finite = aten._local_scalar_dense.default(
        aten.all.default(aten.isfinite.default(aten.where.self(large, s, aten.zeros_like.default(s))))
    )
    if not finite:
        return None
    squarings = int(aten._local_scalar_dense.default(aten.max.default(s))) if s.numel() else 0
    if squarings > _MAX_SQUARINGS:
        return None
    scale = aten.unsqueeze.default(aten.unsqueeze.default(aten.pow.Scalar(2.0, s), -1), -1)
    X = aten.div.Tensor(A, scale)
    eye = aten.expand.default(aten.eye.default(n, dtype=A.dtype, device=A.device), list(A.shape))
    powers = [eye, X]
    for _ in range(2, _DEGREES[-1] + 1):
        powers.append(aten.matmul.default(powers[-1], X))
    result = aten.full_like.default(A, math.nan)
    for i, degree in enumerate(_DEGREES):
        poly = aten.mul.Scalar(powers[degree], 1.0 / math.factorial(degree))
        for k in range(degree - 1, -1, -1):  # smallest terms first
            poly = aten.add.Tensor(poly, aten.mul.Scalar(powers[k], 1.0 / math.factorial(k)))
        if i < len(_DEGREES) - 1:
            lower = -1.0 if i == 0 else thetas[i - 1]
            pick = aten.logical_and.default(aten.gt.Scalar(norm, lower), aten.le.Scalar(norm, thetas[i]))
        else:
            for j in range(squarings):
                poly = aten.where.self(
                    aten.view.default(aten.gt.Scalar(s, j), [*s.shape, 1, 1]), aten.matmul.default(poly, poly), poly
                )
            pick = large
        result = aten.where.self(aten.view.default(pick, [*pick.shape, 1, 1]), poly, result)
    return result


@project_decomposition(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(A):
    if A.dim() < 2 or A.shape[-1] != A.shape[-2] or A.dtype not in _THETAS:
        return NotImplemented
    if A.shape[-1] == 0:
        return aten.clone.default(A)
    if A.shape[-1] == 1:
        return aten.exp.default(A)
    work = A if A.dtype == torch.float64 else aten._to_copy.default(A, dtype=torch.float64)
    result = _mexp(work)
    if result is None:
        return NotImplemented
    return result if result.dtype == A.dtype else aten._to_copy.default(result, dtype=A.dtype)
