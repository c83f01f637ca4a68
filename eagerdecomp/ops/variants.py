"""In-place and out= variants derived from their functional op.

``add_`` is ``add`` followed by a ``copy_`` into ``self``; ``add.out`` is
``add`` followed by an eager-style resize of ``out`` and a ``copy_`` into it.
PyTorch's refs express the same with prims, which run in Python in eager; when
the opset is aten-based these rules stay in aten and reach the opset through
the functional op's own decomposition.
"""

from __future__ import annotations

import functools
import warnings

import torch

from eagerdecomp.ops.attribution import warn_as_eager
from eagerdecomp.ops.overlap import guard, write_expanded, writes_expanded
from eagerdecomp.ops.schema import is_out, written

__all__ = [
    "functional_variant",
    "rule_target",
    "variants",
    "variant_table",
    "foreach_table",
    "out_variant",
    "per_tensor_op",
    "resize_out",
    "with_defaults",
]


def with_defaults(op, args, kwargs):
    """Fill the defaults the dispatcher stripped from a call of ``op``.

    The functional variant may have no default where the in-place op has one
    (``bernoulli_.float(p=0.5)`` vs ``bernoulli.p(p)``).
    """
    args, kwargs = list(args), dict(kwargs)
    for i, a in enumerate(op._schema.arguments):
        if a.kwarg_only:
            if a.name not in kwargs and a.has_default_value() and not (a.alias_info and a.alias_info.is_write):
                kwargs[a.name] = a.default_value
        elif i >= len(args) and a.name not in kwargs and a.has_default_value():
            args.append(a.default_value)
    return args, kwargs


def _arg_types(op, skip_out: bool):
    args = op._schema.arguments
    if skip_out:
        args = [a for a in args if not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)]
    return [str(a.type) for a in args], [a.name for a in args]


@functools.cache
def functional_variant(op):
    """``aten.add_.Tensor -> aten.add.Tensor``, ``aten.add.out -> aten.add.Tensor``, else None.

    The functional overload has the same argument types, minus the out arguments.
    """
    name = op._schema.name.split("::")[-1]
    out = is_out(op)
    if not out and not name.endswith("_"):
        return None
    ns = getattr(torch.ops, op._schema.name.split("::")[0])
    if out:
        base = name
    elif name.startswith("__i") and name.endswith("__"):  # x <<= y: __ilshift__ -> __lshift__
        base = "__" + name[3:]
    else:
        base = name[:-1]
    packet = getattr(ns, base, None)
    if packet is None:
        return None
    want, _ = _arg_types(op, skip_out=out)
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        if cand is op or written(cand):
            continue
        if _arg_types(cand, skip_out=False)[0] == want and len(cand._schema.returns) >= 1:
            return cand
    return None


def _packets_of(ns, base: str) -> list:
    """The packets that may hold a variant of the functional op ``base``: ``add``, ``add_``,
    ``__iadd__`` (for ``__add__``)."""
    names = [base, base + "_"]
    if base.startswith("__") and base.endswith("__"):
        names.append("__i" + base[2:])
    return [p for p in (getattr(ns, n, None) for n in names) if p is not None]


@functools.cache
def variants(op) -> frozenset:
    """``op`` and every overload that computes the same thing: its functional op and the
    in-place and out= overloads of that functional op (``add.Tensor`` -> ``add.Tensor``,
    ``add_.Tensor``, ``add.out``; ``_fused_adamw.default`` -> ``_fused_adamw_.default`` too).

    NOTE: which of them reaches a backend depends on the call (``torch.add(out=)``) and on
    PyTorch's composites (a structured op's functional form runs its out= kernel on a
    device), so a name a user gives for an op must cover them all.
    """
    functional = functional_variant(op) or op
    if written(functional):  # an in-place or out= op with no functional twin: itself alone
        return frozenset({op})
    ns_name, _, base = functional._schema.name.partition("::")
    found = {op, functional}
    for packet in _packets_of(getattr(torch.ops, ns_name), base):
        for overload in packet.overloads():
            cand = getattr(packet, overload)
            if cand is not functional and written(cand) and functional_variant(cand) is functional:
                found.add(cand)
    return frozenset(found)


def rule_target(fn):
    """The functional op that ``fn`` calls when it is one of this module's variant rules (an
    in-place or out= op written as its functional op), else None."""
    return fn.args[1] if getattr(fn, "func", None) in (out_variant, _inplace) else None


def _check_cast(op, result, dest) -> None:
    if not torch.can_cast(result.dtype, dest.dtype):
        raise RuntimeError(f"{op}: result type {result.dtype} can't be cast to the desired output type {dest.dtype}")


def _inplace(op, functional, self, *args, **kwargs):
    guard(op, functional, self, [args, list(kwargs.values())])
    args, kwargs = with_defaults(op, (self, *args), kwargs)
    result = functional(*args, **kwargs)
    if isinstance(self, list):  # _foreach_add_ and friends: one write per tensor, returns ()
        for dest, res in zip(self, result):
            _write(op, dest, res)
        return None
    return _write(op, self, result)


def _write(op, dest, result):
    _check_cast(op, result, dest)
    if result.shape != dest.shape:
        raise RuntimeError(
            f"{op}: output with shape {list(dest.shape)} doesn't match the broadcast shape {list(result.shape)}"
        )
    if writes_expanded(op, dest):  # copy_ refuses a destination that overlaps itself
        return write_expanded(dest, result)
    return dest.copy_(result)


def _eager_resize_message() -> str:
    """ATen's own text of the resize warning, with the shapes ``{old}`` and ``{new}`` left to fill.

    NOTE: read once from eager's resize_output (a CPU kernel on stand-ins [2] -> [3]; the meta
    kernels are Python's, with another text): its
    wording and the source line it names change between releases, and warnings compare equal only
    when their texts do. Read at import, before any thread of the program runs ops.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.abs(torch.zeros(3), out=torch.zeros(2))
    for w in caught:
        text = str(w.message)
        if "had shape [2]" in text and "output shape [3]" in text:
            return (
                text.replace("{", "{{")
                .replace("}", "}}")
                .replace("had shape [2]", "had shape {old}", 1)
                .replace("output shape [3]", "output shape {new}", 1)
            )
    return (  # (a torch that does not warn there: its older wording)
        "An output with one or more elements was resized since it had shape {old}, which does not match the "
        "required output shape {new}. Resizing non-empty outputs is deprecated; resize them to zero elements "
        "first with t.resize_(0)."
    )


_RESIZE_MESSAGE = _eager_resize_message()


def resize_out(out, shape) -> None:
    """Resize an out= tensor to ``shape`` as eager does (with its warning when it held elements)."""
    if out.shape == shape:
        return
    if out.numel() != 0:
        # (eager's category, UserWarning, and its attribution: the line that called the op)
        warn_as_eager(_RESIZE_MESSAGE.format(old=list(out.shape), new=list(shape)))
    out.resize_(shape)


def out_variant(op, functional, *args, **kwargs):
    outs = [kwargs.pop(a.name) for a in op._schema.arguments if a.kwarg_only and a.alias_info and a.alias_info.is_write]
    guard(op, functional, outs, [args, list(kwargs.values())])
    args, kwargs = with_defaults(op, args, kwargs)
    result = functional(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    # a Tensor[] out (unbind_copy.int_out) receives the functional op's whole list
    dests = outs[0] if len(outs) == 1 and isinstance(outs[0], (list, tuple)) else outs
    if len(results) != len(dests):
        return NotImplemented
    for res, out in zip(results, dests):
        _check_cast(op, res, out)
        resize_out(out, res.shape)
        out.copy_(res)
    if not op._schema.returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


_LISTS = {"List[Tensor]": "Tensor", "List[number]": "number"}
# NOTE: a foreach op whose per-tensor op has no overload of its shape maps to the op its
# kernel calls: _foreach_maximum.Scalar is clamp_min per tensor (NaN in either stays NaN).
_PER_TENSOR_ALIAS = {"maximum": "clamp_min", "minimum": "clamp_max"}


def per_tensor_op(op):
    """``_foreach_add.List -> (add.Tensor, positions of the list arguments)``, or None.

    The per-tensor overload takes one element where the foreach op takes a list
    (``Tensor[]`` or ``Scalar[]``), and everything else alike.
    """
    args = op._schema.arguments
    lists = tuple(i for i, a in enumerate(args) if str(a.type) in _LISTS)
    if not lists or any(args[i].kwarg_only for i in lists):
        return None
    name = op._schema.name.split("::")[-1].removeprefix("_foreach_")
    want = [_LISTS.get(str(a.type), str(a.type)) for a in args]
    for packet_name in (name, _PER_TENSOR_ALIAS.get(name)):
        packet = getattr(torch.ops.aten, packet_name, None) if packet_name else None
        fits = []
        for overload in packet.overloads() if packet is not None else ():
            cand = getattr(packet, overload)
            cargs = cand._schema.arguments
            # the per-tensor op may take trailing defaulted extras (add.Scalar's alpha)
            if not is_out(cand) and [str(a.type) for a in cargs[: len(want)]] == want:
                if all(a.has_default_value() for a in cargs[len(want) :]):
                    fits.append((len(cargs), cand))
        if fits:
            return min(fits, key=lambda f: f[0])[1], lists
    return None


def _foreach(op, per_tensor, lists, *args, **kwargs):
    args, kwargs = with_defaults(op, args, kwargs)
    # an argument positional here may be keyword-only there (addcdiv's value)
    keyword = [a.name if a.kwarg_only else None for a in per_tensor._schema.arguments]
    out = []
    for i in range(len(args[lists[0]])):
        pos, kw = [], dict(kwargs)
        for j, a in enumerate(args):
            v = a[i] if j in lists else a
            if keyword[j] is None:
                pos.append(v)
            else:
                kw[keyword[j]] = v
        out.append(per_tensor(*pos, **kw))
    return out


def foreach_table(ops) -> dict:
    """``{op: fn}`` for every functional ``_foreach_*`` overload in ``ops``: the per-tensor op, mapped.

    NOTE: PyTorch has no decomposition for them (their CPU kernels are a C++ loop), and
    optimizers pick them by default on CUDA and PrivateUse1 devices. Their in-place
    forms come from :func:`variant_table`, writing each result back.
    """
    table = {}
    for op in ops:
        name = op._schema.name.split("::")[-1]
        if not name.startswith("_foreach_") or name.endswith("_") or is_out(op):
            continue
        found = per_tensor_op(op)
        if found is not None:
            table[op] = functools.partial(_foreach, op, *found)
    return table


def variant_table(ops) -> dict:
    """``{op: fn}`` for every in-place or out= overload in ``ops`` that has a functional variant."""
    table = {}
    for op in ops:
        if not written(op) or torch.Tag.inplace_view in op.tags:
            continue
        functional = functional_variant(op)
        if functional is None:
            continue
        rule = out_variant if is_out(op) else _inplace
        table[op] = functools.partial(rule, op, functional)
    return table
