"""Matrix products with no decomposition in PyTorch: grouped matrix multiplication
(mixture-of-experts layers: transformers' grouped experts path), ``_trilinear`` and ``addbmm``.

NOTE (grouped mm): no decomposition in PyTorch. ``offs`` holds the cumulative ends of the groups along
the grouped dimension; each row (or column, or slice of the contraction) is matched to
its group by comparing its position with ``offs`` (no data value is read, so the kernel
traces once), then one batched matmul does every group at once. The CPU kernel runs one
mm per group, in the input dtype (16-bit floats accumulate in float32 and round once, as
here). Rows past the last offset are left unwritten by the kernel; they are 0 here.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.checks import scalar_type_name

aten = torch.ops.aten
_REDUCED = (torch.float16, torch.bfloat16)


def _to(t, dtype):
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def _group_of(n, offs, device):
    """``[n]`` int64: the group of each position 0..n-1 (``len(offs)`` past the last end)."""
    pos = aten.unsqueeze.default(aten.arange.default(n, device=device), 1)
    ends = aten.unsqueeze.default(_to(offs, torch.int64), 0)
    return aten.sum.dim_IntList(aten.ge.Tensor(pos, ends), [1])


def _gather_groups(weights, gid, groups):
    """``weights[gid]`` with positions past the last group reading group 0 (masked afterwards)."""
    return aten.index.Tensor(weights, [aten.remainder.Scalar(gid, groups) if groups else gid])


def _zero_past_end(out, gid, groups, dim):
    inside = aten.lt.Scalar(gid, groups)
    shape = [1] * out.dim()
    shape[dim] = gid.shape[0]
    return aten.where.self(aten.view.default(inside, shape), out, aten.full_like.default(out, 0))


@project_decomposition(aten._grouped_mm.default)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    dtype = self.dtype
    if bias is not None or (out_dtype is not None and out_dtype != dtype) or mat2.dtype != dtype:
        return NotImplemented  # the CPU kernel refuses these
    acc = torch.float32 if dtype in _REDUCED else dtype
    a, b = _to(self, acc), _to(mat2, acc)
    if a.dim() == 3 and b.dim() == 3 and offs is None:  # a batch of independent matmuls
        out = aten.bmm.default(a, b)
    elif offs is None:
        return NotImplemented
    elif a.dim() == 2 and b.dim() == 3:  # rows of a grouped: row r uses b[group(r)]
        G = b.shape[0]
        gid = _group_of(a.shape[0], offs, a.device)
        rows = aten.bmm.default(aten.unsqueeze.default(a, 1), _gather_groups(b, gid, G))
        out = _zero_past_end(aten.squeeze.dim(rows, 1), gid, G, 0)
    elif a.dim() == 3 and b.dim() == 2:  # columns of b grouped: column n uses a[group(n)]
        G = a.shape[0]
        gid = _group_of(b.shape[1], offs, a.device)
        cols = aten.bmm.default(_gather_groups(a, gid, G), aten.unsqueeze.default(aten.t.default(b), 2))  # [N, M, 1]
        out = _zero_past_end(aten.t.default(aten.squeeze.dim(cols, 2)), gid, G, 1)
        out = aten.clone.default(out, memory_format=torch.contiguous_format)  # the kernel's [M, N] is row-major
    elif a.dim() == 2 and b.dim() == 2:  # the contraction grouped: out[g] sums its own slice of K
        G = offs.shape[0]
        gid = _group_of(a.shape[1], offs, a.device)
        mask = aten.eq.Tensor(
            aten.unsqueeze.default(gid, 0), aten.unsqueeze.default(aten.arange.default(G, device=a.device), 1)
        )
        masked = aten.mul.Tensor(aten.unsqueeze.default(a, 0), aten.unsqueeze.default(_to(mask, acc), 1))  # [G, M, K]
        out = aten.bmm.default(masked, aten.expand.default(aten.unsqueeze.default(b, 0), [G, *b.shape]))
    else:
        return NotImplemented
    return _to(out, dtype)


# NOTE: _trilinear (behind F.bilinear) multiplies three tensors, each unsqueezed at its expand
# dims, and sums over sumdim; no decomposition in PyTorch. It is one einsum (whose composite
# kernel is permutes, reshapes and bmm: core ops), one letter per dim of the expanded rank;
# the kernel's unroll_dim only picks its loop order. Rounding order differs from the kernel's
# bmm-per-slice (within the default tolerances; 16-bit floats under the accuracy rule).
@project_decomposition(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    if not (i1.dtype == i2.dtype == i3.dtype):
        return NotImplemented
    rank = i1.dim() + len(expand1)
    if rank > 26:
        return NotImplemented
    letters = "abcdefghijklmnopqrstuvwxyz"[:rank]
    terms = ["".join(letters[d] for d in range(rank) if d not in expand) for expand in (expand1, expand2, expand3)]
    summed = set(sumdim)
    present = set("".join(terms))
    # a dim every operand lacks (expanded in all three) has size 1: summed it goes, kept it is
    # restored after the einsum
    kept = [d for d in range(rank) if d not in summed]
    result = "".join(letters[d] for d in kept if letters[d] in present)
    out = torch.einsum(f"{terms[0]},{terms[1]},{terms[2]}->{result}", i1, i2, i3)
    for pos, d in enumerate(kept):
        if letters[d] not in present:
            out = aten.unsqueeze.default(out, pos)
    return aten.clone.default(out, memory_format=torch.contiguous_format)


# NOTE: no decomposition in PyTorch. Eager's kernel adds one batch at a time into the result,
# an addmm per batch (beta applied by the first): the same chain of core addmm calls here,
# bitwise eager in every dtype (a bmm summed over the batch rounds in another order).
@project_decomposition(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    out = aten.expand.default(self, [batch1.shape[1], batch2.shape[2]])
    if batch1.shape[0] == 0:  # eager: self's copy, times beta in place (a float beta on integers refused)
        if beta == 0:
            return aten.zeros_like.default(out, memory_format=torch.contiguous_format)
        if type(beta) is float and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise RuntimeError(
                f"result type Float can't be cast to the desired output type {scalar_type_name(self.dtype)}"
            )
        return aten.mul.Tensor(out, beta)
    for i in range(batch1.shape[0]):
        out = aten.addmm.default(
            out, aten.select.int(batch1, 0, i), aten.select.int(batch2, 0, i), beta=beta if i == 0 else 1, alpha=alpha
        )
    return out
