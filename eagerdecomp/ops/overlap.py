"""Memory-overlap rules of in-place and out= calls: refuse what eager refuses.

Eager's kernels check that the tensor they write does not overlap itself
(an expanded tensor: ``x[:1].expand(5).add_(1)``) nor, partially, one of their
inputs (``torch.add(x[:-1], 10, out=x[1:])``); some refuse any overlap with an
input, a full alias included (``index_select``, ``cat``, ``scatter_``). The
decomposed path computes a fresh result and copies it in, so it would answer
silently where eager raises. :func:`guard` applies the same checks, with
eager's messages, before anything is written.

The rules follow ATen's MemoryOverlap.cpp: internal overlap is a zero stride
over a dimension of size > 1 in a tensor that is not non-overlapping-and-dense;
two tensors overlap partially when they share a storage, are both
non-overlapping-and-dense, and their byte ranges intersect without being the
same range with the same strides (anything else is "too hard" and not refused).

NOTE: the cache key records tensor metadata and which arguments are the same
object, not which share a storage, so a kernel traced for ``add(a, 1, out=b)``
would also serve ``add(x[:-1], 1, out=x[1:])``. While tracing, :func:`guard`
therefore records its check into the kernel as a node (a plain function call,
no op: no backend sees it), and replay checks the real tensors on every call.
"""

from __future__ import annotations

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.multiprocessing.reductions import StorageWeakRef

from eagerdecomp.ops.attribution import warn_as_eager

__all__ = [
    "guard",
    "check",
    "rules_for",
    "tensors",
    "writes_expanded",
    "write_expanded",
    "expanded_writer",
    "has_expanded_dim",
    "storage_positions",
]

aten = torch.ops.aten

INTERNAL = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory "
    "location. Please clone() the tensor before performing the operation."
)
PARTIAL = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation."
)

# NOTE: which checks eager's CPU kernels make, measured per overload (torch 2.13) by calling
# each in-place/out= op with an output that overlaps an input partially, fully, and itself.
# Pointwise ops (TensorIterator) refuse internal and partial overlap and are the default for
# any op tagged pointwise; the table lists the overloads that differ. Unlisted non-pointwise
# ops are not checked (their kernels mostly are not either: sum, mm, softmax accept overlap).
_MEASURED = {
    ("internal", "partial"): """
        _add_relu.out _add_relu_.Tensor absolute.out addmm.out arccos.out arccosh.out arcsin.out
        arcsinh.out arctan.out arctan2.out arctan2_.default arctanh.out bernoulli.out
        bernoulli_.Tensor binary_cross_entropy.out copy_.default cumprod.out cumsum.out divide.out
        divide_.Tensor fix.out floor_divide.out floor_divide_.Tensor greater.Tensor_out
        greater_.Tensor greater_equal.Tensor_out greater_equal_.Tensor hardswish.out huber_loss.out
        less.Tensor_out less_.Tensor less_equal.Tensor_out less_equal_.Tensor lift.out
        logcumsumexp.out max.dim_max mse_loss.out msort.out multiply.out multiply_.Tensor
        negative.out normal.Tensor_Tensor_out normal.Tensor_float_out not_equal.Tensor_out
        not_equal_.Tensor set.source_Tensor_out smooth_l1_loss.out soft_margin_loss.out sort.values
        special_digamma.out special_erf.out special_erfc.out special_erfinv.out special_exp2.out
        special_expit.out special_expm1.out special_gammainc.out special_gammaincc.out
        special_gammaln.out special_i0.out special_log1p.out special_logit.out special_psi.out
        special_round.out special_sinc.out special_xlogy.out subtract.out subtract_.Tensor
        topk.values
    """,
    ("internal",): """
        _conj_physical.out _dirichlet_grad.out _neg_view_copy.out _sample_dirichlet.out
        _standard_gamma.out _standard_gamma_grad.out absolute_.default alias_copy.out
        arccos_.default arccosh_.default arcsin_.default arcsinh_.default arctan_.default
        arctanh_.default bernoulli.Tensor_out bernoulli.float_out bernoulli_.float binomial.out
        cauchy.out cauchy_.default celu.out clone.out copy.out detach_copy.out exponential.out
        exponential_.default fill_.Tensor fix_.default flip.out hardswish_.default
        hardswish_backward.out ldexp_.default lift_fresh_copy.out log_normal.out
        log_normal_.default log_sigmoid.out masked_fill.Scalar_out masked_scatter_.default mean.out
        mm.out nanquantile.out negative_.default poisson.out quantile.out random.out
        random_.default relu.out resize_as.out roll.out rsub.Tensor_out slice_copy.Tensor_out
        slice_scatter.out special_ndtr.out squeeze_copy.out t_copy.out uniform.out
        uniform_.default zero.out
    """,
    ("any", "internal", "partial"): """
        addr.out cat.out diff.out gather.out ger.out index_add.out index_add_.default
        index_copy_.default index_select.out kron.out outer.out put_.default scatter.src_out scatter_.src
        scatter_add_.default stack.out take_along_dim.out
    """,
    ("any", "partial"): "index_put_.default index_fill_.int_Scalar index_fill_.int_Tensor",
    ("partial",): "masked_fill_.Scalar masked_fill_.Tensor",
    (): "conj_physical_.default fill_.Scalar zero_.default threshold_.default",
}
_TABLE = {name: frozenset(rules) for rules, names in _MEASURED.items() for name in names.split()}
_POINTWISE = frozenset({"internal", "partial"})


def rules_for(op, functional) -> frozenset:
    """The checks eager makes for ``op`` (an in-place or out= overload)."""
    name = f"{op._schema.name.split('::')[-1]}.{op._overloadname}"
    if name in _TABLE:
        return _TABLE[name]
    return _POINTWISE if torch.Tag.pointwise in functional.tags else frozenset()


def _dense(t) -> bool:
    return is_non_overlapping_and_dense_or_false(t)


def has_expanded_dim(t) -> bool:
    """Whether ``t`` repeats elements along a dim (stride 0, size > 1), as ``expand`` makes."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def _internal(t) -> bool:
    return not _dense(t) and has_expanded_dim(t)


def _status(a, b) -> str:
    """``"full"``, ``"partial"`` or ``"no"`` (``"no"`` also where ATen says "too hard")."""
    if a is b:
        return "full"
    if a.numel() == 0 or b.numel() == 0 or not (_dense(a) and _dense(b)):
        return "no"
    if StorageWeakRef(a.untyped_storage()) != StorageWeakRef(b.untyped_storage()):
        return "no"
    a0, b0 = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a1, b1 = a0 + a.numel() * a.element_size(), b0 + b.numel() * b.element_size()
    if (a0, a1) == (b0, b1):
        return "full" if a.stride() == b.stride() else "partial"
    return "partial" if a0 < b1 and b0 < a1 else "no"


def check(rules, dests, inputs) -> None:
    """Raise eager's RuntimeError where writing ``dests`` breaks one of ``rules``."""
    for d in dests:
        if "internal" in rules and _internal(d):
            raise RuntimeError(INTERNAL)
        for t in inputs:
            status = _status(d, t)
            if status == "partial" and ("partial" in rules or "any" in rules):
                raise RuntimeError(PARTIAL)
            if status == "full" and "any" in rules:
                raise RuntimeError(PARTIAL)


def tensors(x, out: list | None = None) -> list:
    """Every tensor in ``x`` (a tensor, or lists and tuples of them, nested)."""
    out = [] if out is None else out
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            tensors(y, out)
    return out


def _tracing_recorder():
    """The ``record_check`` of the kernel being traced right now, else None: the innermost
    lowering mode (one with an ``emit``) decides; eager lowering's emitter records nothing."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if hasattr(mode, "emit"):
            return getattr(mode.emit, "record_check", None)
    return None


def _replay_check(rules, dests, inputs):
    check(rules, dests, inputs)


def guard(op, functional, dests, inputs) -> None:
    """Check an in-place/out= call of ``op`` writing ``dests`` (tensors, or lists of them) and
    reading ``inputs`` (arguments: every tensor in them, lists included)."""
    rules = rules_for(op, functional)
    if not rules:
        return
    dests = tensors(dests)
    inputs = tensors(inputs)
    check(rules, dests, inputs)
    if not inputs or not ({"partial", "any"} & rules):
        return  # internal overlap depends on strides alone, which the cache key holds
    record = _tracing_recorder()
    if record is not None:
        record(_replay_check, rules, dests, inputs)


# NOTE: measured as the table above (torch 2.13, CPU): the in-place ops eager lets write a
# tensor that overlaps itself (``torch.rand(1).expand(4).fill_(0)``), with the example eager's
# warning ends with where eager warns, on every call, that this is deprecated (None: silent).
# Every other in-place op refuses such a tensor.
_EXPANDED_WRITES = {
    "fill_.Scalar": None,
    "zero_.default": None,
    "threshold_.default": None,
    "masked_fill_.Scalar": "tensor[mask] = scalar",
    "masked_fill_.Tensor": "tensor[mask] = scalar",
    "index_fill_.int_Scalar": "tensor[mask] = scalar",
    "index_fill_.int_Tensor": "tensor[mask] = scalar",
    "index_put_.default": "tensor[indices] = tensor",
}
EXPANDED_WARNING = (
    "Use of {} on expanded tensors is deprecated. Please clone() the tensor before performing this operation. "
    "This also applies to advanced indexing e.g. {}"
)


def _name(op) -> str:
    return f"{op._schema.name.split('::')[-1]}.{op._overloadname}"


def expanded_writer(op) -> bool:
    """Whether eager lets ``op`` write a tensor that overlaps itself (warning or not)."""
    return _name(op) in _EXPANDED_WRITES


def writes_expanded(op, dest) -> bool:
    """True when ``op`` writes ``dest``, a tensor that overlaps itself, and eager allows it
    (warning first where eager warns)."""
    name = _name(op)
    if name not in _EXPANDED_WRITES or not _internal(dest):
        return False
    if _EXPANDED_WRITES[name]:
        warn_as_eager(EXPANDED_WARNING.format(name.split(".")[0], _EXPANDED_WRITES[name]))
    return True


def storage_positions(size, stride, offset, device):
    """The storage position of each element of a view (``size``-shaped, int64)."""
    pos = aten.full.default([1] * len(size), offset, dtype=torch.int64, device=device)
    for d, (k, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = k
        pos = aten.add.Tensor(pos, aten.view.default(aten.mul.Tensor(aten.arange.default(k, device=device), s), shape))
    return aten.expand.default(pos, list(size))


def write_expanded(dest, result):
    """Write ``result`` into ``dest``, a tensor that overlaps itself, as eager's kernels leave
    its memory: a storage slot that some written position changed takes the value of the
    last such position (row-major); every other slot keeps its value. NOTE: the ops that allow
    it write one value per slot (a fill), or, index_put_, values whose order eager leaves
    undefined (duplicate indices)."""
    if dest.numel() == 0:
        return dest
    size, stride, lo = list(dest.shape), list(dest.stride()), dest.storage_offset()
    span = 1 + sum((k - 1) * st for k, st in zip(size, stride))
    slots = aten.as_strided.default(dest, [span], [1], lo)
    pos = aten.sub.Tensor(aten.reshape.default(storage_positions(size, stride, lo, dest.device), [-1]), lo)
    if result.dtype != dest.dtype:
        result = aten._to_copy.default(result, dtype=dest.dtype)
    new = aten.reshape.default(aten.expand.default(result, size), [-1])
    old = aten.reshape.default(dest, [-1])
    if dest.dtype in _BAREBONES:  # compared and gathered as int64 (same values), written back
        new, old = (aten._to_copy.default(t, dtype=torch.int64) for t in (new, old))
    order = aten.arange.default(new.shape[0], device=dest.device)
    who = aten.where.self(aten.ne.Tensor(new, old), order, aten.full_like.default(order, -1))
    winner = aten.scatter_reduce.two(
        aten.full.default([span], -1, dtype=torch.int64, device=dest.device), 0, pos, who, "amax"
    )
    picked = aten.index_select.default(new, 0, aten.clamp_min.default(winner, 0))
    current = aten._to_copy.default(slots, dtype=torch.int64) if dest.dtype in _BAREBONES else slots
    aten.copy_.default(slots, aten.where.self(aten.ge.Scalar(winner, 0), picked, current))
    return dest


# unsigned types wider than a byte: few CPU kernels (no comparison, no index_select) take them
_BAREBONES = (torch.uint16, torch.uint32, torch.uint64)
