"""Core ATen ops with no path to the ``prims_fusion`` preset: 3-D average pooling (plain and
adaptive), pairwise distances (``_cdist_forward``, ``_pdist_forward``), ``_embedding_bag``, the minimum's
position (``min.dim``, ``argmin``: through ``max.dim`` and ``argmax`` of an order-reversed input)
and the functional ``copy``.

Core ATen keeps all of them, so these entries change nothing there (an opset's own ops leave
the table); a prims opset reaches its library ops (``index``, ``mm``/``bmm``, ``index_put``,
``max.dim``) through them. Their backwards are in :mod:`.backward` and :mod:`.embedding_bag`.

NOTE: every window sum gathers the window's elements (``index_select`` at clamped positions,
out-of-window ones replaced by 0) and sums them: a matrix product with 0/1 window matrices
would be shorter, but 0 * inf is NaN, so an infinite input would spoil every output, not
only its own windows'. The sums add in another order than the CPU kernels' loops (floats
agree to rounding); divisors are the kernels' integers.
"""

from __future__ import annotations

import torch
from torch._meta_registrations import pooling_output_shape
from torch._prims_common import suggest_memory_format

from eagerdecomp.decompositions.numerics import cast, opmath
from eagerdecomp.decompositions.pooling import _windows
from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.checks import checks_for, dtype_check, scalar_type_name
from eagerdecomp.ops.overlap import has_expanded_dim

aten = torch.ops.aten


# -- 3-D average pooling -------------------------------------------------------------------------


def _strided_windows(n_in, n_out, k, s, p, device):
    """[n_out, k] clamped input positions of each output's window, their validity (inside the
    input), and the window starts (padding included), an int64 [n_out, 1] tensor."""
    start = aten.sub.Tensor(aten.mul.Tensor(aten.unsqueeze.default(aten.arange.default(n_out, device=device), 1), s), p)
    pos = aten.add.Tensor(start, aten.unsqueeze.default(aten.arange.default(k, device=device), 0))
    ok = aten.logical_and.default(aten.ge.Scalar(pos, 0), aten.lt.Scalar(pos, n_in))
    return aten.clamp.default(pos, 0, max(n_in - 1, 0)), ok, start


def _box_sum(x, wins):
    """Sum of ``x`` (its last ``len(wins)`` dims) over each output's box of windows; ``wins`` is
    one ``(positions [O, K], valid [O, K])`` pair per spatial dim."""
    nd = len(wins)
    zero = aten.scalar_tensor.default(0, dtype=x.dtype, device=x.device)
    for d, (pos, ok) in enumerate(wins):
        axis = x.dim() - nd + d
        n_out, k = pos.shape
        shape = list(x.shape)
        x = aten.view.default(
            aten.index_select.default(x, axis, aten.reshape.default(pos, [-1])),
            shape[:axis] + [n_out, k] + shape[axis + 1 :],
        )
        mask = aten.view.default(ok, [n_out, k] + [1] * (x.dim() - axis - 2))
        x = aten.sum.dim_IntList(aten.where.self(mask, x, zero), [axis + 1])
    return x


def _like_input(out, self):
    # the CPU kernels keep a channels-last-3d input's layout, else return contiguous
    fmt = torch.channels_last_3d if self.dim() == 5 and suggest_memory_format(self) == torch.channels_last_3d else None
    return aten.clone.default(out, memory_format=fmt or torch.contiguous_format)


# NOTE: the dtypes the CPU kernels are instantiated for (measured on torch 2.13); the others
# raise NotImplementedError there (the check runs the CPU kernel on a stand-in for its message)
_KERNEL_DTYPES = {
    aten.avg_pool3d: frozenset({torch.float32, torch.float64, torch.int64}),
    aten._adaptive_avg_pool3d: frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
}
for _packet, _dtypes in _KERNEL_DTYPES.items():
    checks_for(_packet)(dtype_check(_packet, _dtypes))


def _triple(v, default=None):
    v = list(v) if v else list(default)
    return v * 3 if len(v) == 1 else v


@project_decomposition(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if self.dim() not in (4, 5):
        return NotImplemented  # eager's own checks and errors (empty inputs)
    if isinstance(padding, int):
        padding = [padding]
    ks, ss, ps = _triple(kernel_size), _triple(stride, kernel_size), _triple(padding)
    # eager's output sizes (its argument checks are the meta kernel's, run before any decomposition)
    out_shape = [pooling_output_shape(n, k, p, s, 1, ceil_mode) for n, k, s, p in zip(self.shape[-3:], ks, ss, ps)]
    acc = opmath(self.dtype)
    wins, divisor = [], None
    for n_in, n_out, k, s, p in zip(self.shape[-3:], out_shape, ks, ss, ps):
        pos, ok, start = _strided_windows(n_in, n_out, k, s, p, self.device)
        wins.append((pos, ok))
        end = aten.clamp.default(aten.add.Tensor(start, k), None, n_in + p)
        if count_include_pad:
            size = aten.sub.Tensor(end, start)
        else:
            size = aten.sub.Tensor(aten.clamp.default(end, None, n_in), aten.clamp.default(start, 0))
        size = aten.view.default(size, [n_out])
        divisor = size if divisor is None else aten.mul.Tensor(aten.unsqueeze.default(divisor, -1), size)
    total = _box_sum(cast(self, acc), wins)
    # int64 (the one integer dtype the kernel has) divides as C++ does: toward zero
    rounding = None if self.dtype.is_floating_point else "trunc"
    if divisor_override:
        out = aten.div.Scalar_mode(total, divisor_override, rounding_mode=rounding)
    else:
        out = aten.div.Tensor_mode(total, cast(divisor, acc), rounding_mode=rounding)
    return _like_input(cast(out, self.dtype), self)


@project_decomposition(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    if self.dim() not in (4, 5):
        return NotImplemented  # eager's own checks and errors
    # NOTE: the kernel's check (from dim 1 whatever the rank), which the meta kernel lacks
    for i in range(1, self.dim()):
        if self.shape[i] == 0:
            raise RuntimeError(
                "adaptive_avg_pool3d(): Expected input to have non-zero size for non-batch dimensions, but input "
                f"has sizes {list(self.shape)} with dimension {i} being empty"
            )
    if 0 in output_size:
        shape = list(self.shape[:-3]) + list(output_size)
        return aten.empty.memory_format(shape, dtype=self.dtype, device=self.device)  # (contiguous, as eager's)
    acc = opmath(self.dtype)
    wins, sizes = [], []
    for n_in, n_out in zip(self.shape[-3:], output_size):
        pos, ok, _k = _windows(n_in, n_out, self.device)
        wins.append((pos, ok))
        sizes.append(aten.sum.dim_IntList(ok, [1]))  # window lengths
    # NOTE: the kernel adds and divides in the input's dtype (bfloat16 and float16 included),
    # dividing the sum by the three window lengths in turn (sum / kd / kh / kw): the sum is
    # rounded to the dtype once here (added more accurately), each division as the kernel's
    out = cast(_box_sum(cast(self, acc), wins), self.dtype)
    for d, size in enumerate(sizes):
        shape = [1] * 3
        shape[d] = -1
        out = aten.div.Tensor(out, cast(aten.view.default(size, shape), self.dtype))
    return _like_input(out, self)


# -- pairwise distances --------------------------------------------------------------------------

_C_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
}
_USE_MM = 1  # compute_mode: 0 the mm path past 25 rows, 1 always, 2 never


def _pairwise(x1, x2, p):
    """The CPU kernel's exact path: |x1_i - x2_j| reduced by p over the columns."""
    diff = aten.abs.default(aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3)))
    if p == 0:
        return cast(aten.sum.dim_IntList(aten.ne.Scalar(diff, 0), [-1]), x1.dtype)
    if p == 1:
        return aten.sum.dim_IntList(diff, [-1])
    if p == 2:
        return aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(diff, diff), [-1]))
    if p == float("inf"):
        return aten.amax.default(diff, [-1])
    return aten.pow.Tensor_Scalar(aten.sum.dim_IntList(aten.pow.Tensor_Scalar(diff, p), [-1]), 1.0 / p)


# NOTE: the meta kernel names a refused dtype as torch does (torch.int64), eager's kernel as C++
# does (Long); checks run before the meta kernel, after eager's own earlier checks pass
@checks_for(aten._cdist_forward)
def _cdist_dtypes(x1, x2, p, compute_mode=None, **out):
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        return  # (the meta kernel's refusals, in eager's order and words)
    for name, x in (("X1", x1), ("X2", x2)):
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {scalar_type_name(x.dtype)}")


@project_decomposition(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    if not x1.dtype.is_floating_point or x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        return NotImplemented  # eager's own checks and errors
    if p < 0:
        return NotImplemented
    r1, r2, c = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    batch = list(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    shape = batch + [r1, r2]
    if 0 in shape:
        return aten.empty.memory_format(shape, dtype=x1.dtype, device=x1.device)
    if c == 0:
        return aten.zeros.default(shape, dtype=x1.dtype, device=x1.device)
    x1 = aten.expand.default(x1, batch + [r1, c])
    x2 = aten.expand.default(x2, batch + [r2, c])
    mode = compute_mode or 0
    # NOTE: which dtypes eager takes, and its words, depend on the path (both measured on torch 2.13)
    if p == 2 and (mode == _USE_MM or (mode == 0 and (r1 > 25 or r2 > 25))):
        # the kernel's matrix-product path (cdist_impl): |a|^2 - 2 a.b + |b|^2, clamped at 0
        if x1.dtype != x2.dtype:
            raise RuntimeError(
                f"expected m1 and m2 to have the same dtype, but got: {_C_NAMES[x1.dtype]} != {_C_NAMES[x2.dtype]}"
            )
        return aten.clone.default(aten._euclidean_dist.default(x1, x2), memory_format=torch.contiguous_format)
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(x1.dtype)} but found {scalar_type_name(x2.dtype)}")
    if x1.dtype not in (torch.float32, torch.float64):
        raise NotImplementedError(f"\"cdist\" not implemented for '{scalar_type_name(x1.dtype)}'")
    return aten.clone.default(_pairwise(x1, x2, float(p)), memory_format=torch.contiguous_format)


# NOTE: pdist is the rows' distance table read above the diagonal in row-major order, as eager
# lists the pairs: the table costs twice the pairs' work, and each distance is the CPU kernel's
# own formula (_pairwise), so values agree to the order of the sums. pdist() has made the
# input contiguous and checked its rank, dtype and p before it calls this op.
@project_decomposition(aten._pdist_forward.default)
def pdist_forward(self, p=2.0):
    if not self.is_contiguous():
        raise RuntimeError("_pdist_forward requires contiguous input")
    if self.dim() != 2 or self.dtype not in (torch.float32, torch.float64) or p < 0:
        return NotImplemented
    n, c = self.shape
    pairs = n * (n - 1) // 2
    if pairs == 0 or c == 0:
        return aten.full.default([pairs], 0, dtype=self.dtype, device=self.device)
    upper = aten.triu_indices.default(n, n, 1, dtype=torch.int64, device=self.device)
    at = aten.add.Tensor(aten.mul.Tensor(aten.select.int(upper, 0, 0), n), aten.select.int(upper, 0, 1))
    return aten.index_select.default(aten.view.default(_pairwise(self, self, float(p)), [-1]), 0, at)


# -- EmbeddingBag --------------------------------------------------------------------------------
SUM, MEAN, MAX = 0, 1, 2


def _fast_sum(weight, per_sample_weights, padding_idx) -> bool:
    # the CPU kernel's fast sum path (is_fast_path in EmbeddingBag.cpp), which leaves offset2bag
    # empty; the meta kernel asks the same
    fast = weight.dtype in (torch.float32, torch.float16) and weight.stride(1) == 1 and padding_idx < 0
    return fast and (per_sample_weights is None or per_sample_weights.stride(0) == 1)


def _bag_of(n, offsets, bags, device):
    """offset2bag as the CPU kernel makes it: a mark at each offset, a running sum, minus 1."""
    marks = aten.full.default([n + 1], 0, dtype=torch.int64, device=device)
    used = aten.clamp.default(aten._to_copy.default(aten.slice.Tensor(offsets, 0, 0, bags), dtype=torch.int64), 0, n)
    marks = aten.index_put.default(marks, [used], aten.ones_like.default(used), True)
    return aten.sub.Tensor(aten.cumsum.default(aten.slice.Tensor(marks, 0, 0, n), 0), 1)


def _bag_max(rows, valid, bag, start, bags, indices):
    """Each bag's maximum per column and its row in weight, by the CPU kernel's scan: the bag's
    first (non-padding) element, then any strictly greater one (so a NaN stays only when it
    comes first, and the first of equal maxima wins); an empty bag gives 0 and row 0."""
    n, d = rows.shape
    device = rows.device
    pos = aten.sub.Tensor(aten.arange.default(n, device=device), aten.index.Tensor(start, [bag]))
    # NOTE: the longest bag is a data value: the call takes the bypass path (decomposed eagerly)
    width = int(aten._local_scalar_dense.default(aten.amax.default(pos, [0]))) + 1
    values = aten.index_put.default(
        aten.full.default([bags, width, d], 0, dtype=rows.dtype, device=device), [bag, pos], rows
    )
    where = [bag, pos]
    member = aten.index_put.default(
        aten.full.default([bags, width], False, dtype=torch.bool, device=device), where, valid
    )
    word = aten.index_put.default(aten.full.default([bags, width], 0, dtype=torch.int64, device=device), where, indices)
    member = aten.unsqueeze.default(member, -1)  # [B, L, 1]
    t = aten.view.default(aten.arange.default(width, device=device), [1, width, 1])
    none = aten.full.default([], width, dtype=torch.int64, device=device)

    def first(mask):  # [B, 1, D] the first position where mask holds (width where none does)
        return aten.amin.default(aten.where.self(mask, t, none), [1], True)

    head = first(aten.expand.default(member, [bags, width, d]))
    head_c = aten.clamp.default(head, None, width - 1)
    head_nan = aten.isnan.default(aten.gather.default(values, 1, head_c))
    plain = aten.logical_and.default(member, aten.logical_not.default(aten.isnan.default(values)))
    low = aten.full.default([], -float("inf"), dtype=rows.dtype, device=device)
    top = aten.amax.default(aten.where.self(plain, values, low), [1], True)
    best = first(aten.logical_and.default(plain, aten.eq.Tensor(values, top)))
    pick = aten.clamp.default(aten.where.self(head_nan, head_c, best), None, width - 1)
    empty = aten.squeeze.dim(aten.eq.Scalar(head, width), 1)
    out = aten.squeeze.dim(aten.gather.default(values, 1, pick), 1)
    rows_of = aten.squeeze.dim(
        aten.gather.default(aten.expand.default(aten.unsqueeze.default(word, -1), [bags, width, d]), 1, pick), 1
    )
    zero = aten.full.default([], 0, dtype=rows.dtype, device=device)
    return aten.where.self(empty, zero, out), aten.where.self(empty, aten.zeros_like.default(rows_of), rows_of)


def _read(t):
    return aten._local_scalar_dense.default(t)


# NOTE: eager's checks of the offsets' and indices' values (check_arguments and the kernels'
# range checks), made before anything is computed. They read data, so every call takes the
# bypass path (decomposed eagerly; max mode reads its longest bag anyway). Offsets that
# decrease, which eager reads past its bags without a check, are declined (a clear error).
def _check_values(weight, indices, offsets, include_last_offset, mode) -> bool:
    """Raise eager's error for the values eager refuses; False where the offsets decrease."""
    n, m = indices.shape[0], offsets.shape[0]
    if m:
        first, last = aten.select.int(offsets, 0, 0), aten.select.int(offsets, 0, -1)
        if _read(aten.ne.Scalar(first, 0)):
            kind = "Long" if offsets.dtype == torch.int64 else "Int"
            raise RuntimeError(
                "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
                f"However, got {_read(first)}\n[ torch.{kind}Tensor{{}} ]"
            )
        if _read(aten.gt.Scalar(last, n)):
            raise RuntimeError(
                f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {_read(last)}"
            )
        if m > 1 and _read(
            aten.any.default(aten.lt.Tensor(aten.slice.Tensor(offsets, 0, 1), aten.slice.Tensor(offsets, 0, 0, m - 1)))
        ):
            return False
    if n:
        outside = aten.logical_or.default(aten.lt.Scalar(indices, 0), aten.ge.Scalar(indices, weight.shape[0]))
        if _read(aten.any.default(outside)):
            # (the sum and mean kernels word this by their code path; max mode's words, eager's type)
            at = _read(aten.argmax.default(aten._to_copy.default(outside, dtype=torch.int32)))
            value = _read(aten.select.int(indices, 0, at))
            raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}")
    return True


@project_decomposition(aten._embedding_bag.default)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    if indices.dim() != 1 or offsets.dim() != 1 or weight.dim() != 2 or mode not in (SUM, MEAN, MAX):
        return NotImplemented  # eager's own checks and errors
    if per_sample_weights is not None and mode != SUM:
        return NotImplemented
    if not _check_values(weight, indices, offsets, include_last_offset, mode):
        return NotImplemented
    device, n, d = weight.device, indices.shape[0], weight.shape[1]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    on_cpu = offsets.device.type == "cpu"
    book = offsets.dtype if on_cpu else indices.dtype  # the meta kernel's bookkeeping dtype, by device
    bag = _bag_of(n, offsets, bags, device)
    index = aten._to_copy.default(indices, dtype=torch.int64)
    valid = aten.ne.Scalar(index, padding_idx) if padding_idx >= 0 else aten.full.default([n], True, device=device)
    counts = aten.index_put.default(
        aten.full.default([bags], 0, dtype=torch.int64, device=device),
        [bag],
        aten._to_copy.default(valid, dtype=torch.int64),
        True,
    )
    rows = aten.index.Tensor(weight, [index])
    if mode == MAX:
        if n == 0:
            out = aten.full.default([bags, d], 0, dtype=weight.dtype, device=device)
            max_rows = aten.full.default([bags, d], 0, dtype=torch.int64, device=device)
        else:
            start = aten._to_copy.default(aten.slice.Tensor(offsets, 0, 0, bags), dtype=torch.int64)
            out, max_rows = _bag_max(rows, valid, bag, start, bags, index)
    else:
        acc = opmath(weight.dtype)
        rows = cast(rows, acc)
        if per_sample_weights is not None:
            rows = aten.mul.Tensor(rows, aten.unsqueeze.default(cast(per_sample_weights, acc), 1))
        rows = aten.where.self(
            aten.unsqueeze.default(valid, 1), rows, aten.full.default([], 0, dtype=acc, device=device)
        )
        out = aten.index_put.default(aten.full.default([bags, d], 0, dtype=acc, device=device), [bag], rows, True)
        if mode == MEAN:  # over the bag's non-padding entries; an empty bag stays 0
            out = aten.div.Tensor(out, aten.unsqueeze.default(cast(aten.clamp.default(counts, 1), acc), 1))
        out = cast(out, weight.dtype)
    # the bookkeeping outputs, shaped as the meta kernel says for this device, valued as CPU's
    if on_cpu:
        keep_bag = mode != SUM or not _fast_sum(weight, per_sample_weights, padding_idx)
        offset2bag = bag if keep_bag else aten.full.default([0], 0, dtype=torch.int64, device=device)
        bag_size = counts if mode != SUM else aten.zeros_like.default(counts)
        max_indices = {MAX: None, MEAN: bag_size, SUM: aten.zeros_like.default(counts)}[mode]
    else:
        offset2bag = bag
        extra = offsets.shape[0] - bags  # (include_last_offset: the meta kernel's one more, 0)
        bag_size = (
            aten.cat.default([counts, aten.full.default([extra], 0, dtype=torch.int64, device=device)])
            if extra
            else counts
        )
        max_indices = None if mode == MAX else aten.full.default([0], 0, dtype=torch.int64, device=device)
    if max_indices is None:
        max_indices = max_rows
    return (
        aten.clone.default(out, memory_format=torch.contiguous_format),
        aten._to_copy.default(offset2bag, dtype=book),
        aten._to_copy.default(bag_size, dtype=book),
        aten._to_copy.default(max_indices, dtype=book),
    )


# -- the minimum's position: min.dim and argmin through the preset's max.dim and argmax -----------


def _reversed(x):
    """A map of ``x``'s values that reverses their order, keeps ties tied and NaN NaN: the maximum's
    first position in it is the minimum's first position in ``x``.

    NOTE: integers through ``~v`` (``-v - 1``), not ``-v``, which overflows at the type's minimum
    (and for unsigned types is no reversal); floats through ``-v`` (``-0.0`` and ``0.0`` stay tied)."""
    if x.dtype == torch.bool:
        return aten.logical_not.default(x)
    if x.is_floating_point():
        return aten.neg.default(x)
    return aten.bitwise_not.default(x)


def _min_checks(name, x, dim):
    """Eager's refusals, in its words (the max ops' would name themselves)."""
    if x.is_complex():
        raise RuntimeError(f"{name}(): does not support complex input")
    if name == "argmin" and x.dtype == torch.bool:
        raise RuntimeError("argmin(): does not support bool input")
    if dim is None:
        if x.numel() == 0:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        return
    d = dim % x.dim() if x.dim() and -x.dim() <= dim < x.dim() else None
    if d is not None and x.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


@project_decomposition(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    _min_checks("min", self, dim)
    _, indices = aten.max.dim(_reversed(self), dim, keepdim)  # (eager's dim-range error if out of range)
    if self.dim() == 0:
        return aten.clone.default(self), indices
    # the values are read back at the positions: the input's own elements (signed zeros included)
    d = dim % self.dim()
    at = indices if keepdim else aten.unsqueeze.default(indices, d)
    values = aten.gather.default(self, d, at)
    return (values if keepdim else aten.squeeze.dim(values, d)), indices


@project_decomposition(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    _min_checks("argmin", self, dim)
    return aten.argmax.default(_reversed(self), dim, keepdim)


# -- the functional copy ---------------------------------------------------------------------------


def _overlaps(t) -> bool:
    """Whether two positions of ``t`` may share memory: its dims of size > 1 by stride, each
    stride must reach past the extent of the smaller ones (conservative: a layout that fails
    this may still not overlap, and is declined all the same)."""
    extent = 1
    for stride, size in sorted((abs(s), n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride < extent:
            return True
        extent = stride * size
    return False


# NOTE: ``copy`` is ``copy_``'s functional form (what ``fill_.Tensor`` and functionalized graphs
# lower to): a tensor laid out as ``self`` holding ``src`` broadcast and converted to ``self``'s
# dtype and device. An expanded ``self`` (a 0 stride) eager clones contiguous first, which this
# is; one that overlaps otherwise is declined: eager clones it with its strides and writes
# through them, so which element wins depends on the write order.
@project_decomposition(aten.copy.default)
def copy(self, src, non_blocking=False):
    if _overlaps(self) and not has_expanded_dim(self):
        return NotImplemented
    if src.dtype != self.dtype or src.device != self.device:
        src = aten._to_copy.default(src, dtype=self.dtype, device=self.device)
    out = aten.expand.default(src, self.shape)
    return aten.clone.default(out, memory_format=torch.contiguous_format)
