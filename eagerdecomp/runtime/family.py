"""Shape families: one kernel for many shapes of one op call.

A call's *family key* is its exact key (:mod:`eagerdecomp.key`) with each tensor's
sizes and strides replaced by its rank and layout class (stride order, dense or not,
offset or not), and its ``SymInt`` arguments by a marker: op, rank, dtype, device,
layout class, which arguments are the same object, other non-tensor arguments by
value, ambient state. A family holds :class:`Member` kernels traced over symbolic sizes
(:func:`eagerdecomp.trace.trace_family`), each with the :class:`~eagerdecomp.symbolic.Guard`
of the shapes it admits.

Eager-exactness for every admitted shape is proved once or checked per key, never
assumed. A member is *proved* when its trace shows that eager's meta kernel, run over
the same symbols, returns the member's output metadata (shapes, strides, storage
offsets as expressions of the input sizes) and aliasing, and took every decision on a
size by a guard (so the member's :class:`~eagerdecomp.symbolic.Guard` holds them all; no
``statically_known_true`` answered "unknown", :func:`~eagerdecomp.symbolic.unguarded`): at
any shape the guard admits, eager's meta kernel then takes the same branches and returns
the same expressions, evaluated. A proved member answers a new exact key with no meta
kernel run. Otherwise (``Member.unproven`` says why, and the report shows it) the first
time an exact key is answered by the member, its output metadata is evaluated at the
call's sizes and compared with the op's own meta kernel run on the call (:func:`agrees`).
A member that disagrees is never used again for its family; the family falls back to
exact-shape kernels, and the reason is reported. Either way, the replayed outputs are
compared with the member's metadata at the call's sizes (:func:`matches`): what the real
kernels return, against what the symbolic trace said they would.
``EAGERDECOMP_AUDIT_PROOFS=1`` checks proved members per key as well, and makes a
disagreement an error (the tests run so).

Calls that are kept to exact-shape kernels from the start (:func:`family_key` raises
:class:`~eagerdecomp.symbolic.NotGeneric`): expanded tensors (a stride of 0) given to
a mutating op, empty
tensors, tensors with conj/neg bits, distinct tensors sharing memory; out= ops (their
outputs are resized). Strided and offset tensors (slices) are admitted: their strides
and storage offset are symbols too. ``SymInt`` arguments (sizes) >= 2 are symbols.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from eagerdecomp.runtime.key import Key
from eagerdecomp.runtime.symbolic import NotGeneric, bindings, compile_expr

__all__ = [
    "enabled",
    "Member",
    "Family",
    "family_key",
    "out_meta",
    "agrees",
    "matches",
    "audit",
    "MAX_MEMBERS",
    "symint_positions",
    "int_paths",
    "read_ints",
]


def enabled() -> bool:
    """``EAGERDECOMP_SHAPE_GENERIC=0`` keeps every op on exact-shape kernels (as before families)."""
    return os.environ.get("EAGERDECOMP_SHAPE_GENERIC", "1") != "0"


def audit() -> bool:
    """``EAGERDECOMP_AUDIT_PROOFS=1``: proved members are checked against the meta kernel per key too."""
    return os.environ.get("EAGERDECOMP_AUDIT_PROOFS", "0") == "1"


# a family that needs more members than this is specializing on sizes: exact kernels are cheaper
MAX_MEMBERS = 8


@dataclass(frozen=True, eq=False)  # compared by identity: its kernel and dict are not values
class Member:
    """A shape-generic kernel and what it admits.

    ``sources``: ``{symbol: (tensor index, kind, dim)}``; ``metas``: per output, ``(shape,
    stride, offset)`` as ints or sympy expressions of the symbols (None for a non-tensor);
    ``shares``: per output, whether eager's output shares memory with an input;
    ``unproven``: why a new exact key is checked against eager's meta kernel, None where the
    trace proved the member for every shape its guard admits.
    """

    kernel: object
    guard: object
    sources: dict
    metas: tuple
    shares: tuple
    unproven: str | None = "made before proofs"

    @functools.cached_property
    def _layout(self):
        """Per output, ``(shape fns, stride fns, offset fn)`` of the values of :func:`bindings`."""
        return tuple(
            None if m is None else (tuple(map(compile_expr, m[0])), tuple(map(compile_expr, m[1])), compile_expr(m[2]))
            for m in self.metas
        )

    def layout(self, tensors, ints=()) -> list:
        """Per output, ``(shape, stride, offset)`` at these inputs' sizes (None for a non-tensor)."""
        values = bindings(self.sources, tensors, ints)
        return [
            None if m is None else ([f(values) for f in m[0]], [f(values) for f in m[1]], m[2](values))
            for m in self._layout
        ]


@dataclass(frozen=True)
class Family:
    """A family's members, or why it is kept to exact-shape kernels (``exact``)."""

    members: tuple = ()
    exact: str | None = None


def _expr(v):
    if isinstance(v, torch.SymInt):
        i = v.node.maybe_as_int()
        return i if i is not None else v.node.shape_env.replace(v.node.expr)
    return int(v)


def out_meta(env, o):
    """An output's ``(shape, stride, offset)`` as ints or expressions; None for a non-tensor."""
    if not isinstance(o, torch.Tensor):
        return None
    return (tuple(map(_expr, o.shape)), tuple(map(_expr, o.stride())), _expr(o.storage_offset()))


def _layout_class(shape, stride, offset, expanded_ok: bool = False) -> tuple:
    """A tensor's stride order (outermost first), whether it is dense in that order, and
    whether it starts at a storage offset: tensors differing in these never share a kernel."""
    perm = sorted(range(len(shape)), key=lambda d: -stride[d])
    expected, dense = 1, True
    for d in reversed(perm):
        if shape[d] != 1 and stride[d] != expected:
            dense = False
        expected *= shape[d]
    # NOTE: an expanded tensor (stride 0) is read by functional ops like any strided one
    # (its 0 strides are specialized, so the guard requires them); a mutating op writing
    # overlapping memory keeps exact kernels
    if not dense and not expanded_ok and any(s == 0 for n, s in zip(shape, stride) if n > 1):
        raise NotGeneric("a tensor argument is expanded (a stride of 0) for a mutating op")
    return tuple(perm), dense, offset != 0


_SYMINT = re.compile(r"SymInt(?:\[\d*\])?\??\s+(\w+)")
_POSITIONS: dict = {}


def symint_positions(func) -> tuple:
    """Positions (index, or kwarg name) of ``func``'s ``SymInt`` / ``SymInt[]`` arguments.

    NOTE: read from the schema's text: the parsed schema's argument types say ``int`` for
    both, and only ``SymInt`` arguments are sizes that may become symbols (``dim`` stays a value).
    """
    out = _POSITIONS.get(func)
    if out is None:
        names = set(_SYMINT.findall(str(func._schema)))
        if func.overloadpacket is torch.ops.aten.arange:
            # NOTE: arange's bounds are Scalars, but an int bound is a length (a KV cache's positions)
            names |= {"start", "end", "step"}
        out = _POSITIONS[func] = tuple(
            a.name if a.kwarg_only else i for i, a in enumerate(func._schema.arguments) if a.name in names
        )
    return out


def _at(args, kwargs, pos):
    if type(pos) is int:
        return args[pos] if pos < len(args) else None
    return kwargs.get(pos)


def int_paths(positions: tuple, args, kwargs) -> tuple:
    """``(position, list index or None)`` of every int >= 2 at ``positions``: the ints made symbols.

    0 and 1 stay values (a decomposition specializes on them, as on sizes), and so do
    negative ints (-1 in a view's size means "infer").
    """
    out = []
    for pos in positions:
        v = _at(args, kwargs, pos)
        if type(v) is int:
            if v >= 2:
                out.append((pos, None))
        elif type(v) in (list, tuple):
            out.extend((pos, i) for i, x in enumerate(v) if type(x) is int and x >= 2)
    return tuple(out)


def read_ints(paths: tuple, args, kwargs) -> list:
    """The values at ``paths`` (:func:`int_paths`) of a call."""
    out = []
    for pos, i in paths:
        v = _at(args, kwargs, pos)
        out.append(v if i is None else v[i])
    return out


def _part_indices(args, kwargs) -> dict:
    """Where each argument (and each element of a list argument) sits in a key's parts."""
    out: dict = {}
    n = 1  # parts[0] is the op

    def size(x) -> int:
        if type(x) is list or type(x) is tuple:
            return 1 + sum(size(y) for y in x)
        return 1

    def place(pos, v):
        nonlocal n
        out[pos, None] = n
        if type(v) is list or type(v) is tuple:
            m = n + 1
            for i, y in enumerate(v):
                out[pos, i] = m
                m += size(y)
        n += size(v)

    for i, a in enumerate(args):
        place(i, a)
    for k, v in kwargs.items():
        n += 1  # the kwarg's name
        place(k, v)
    return out


def family_key(func, key: Key, tensors: list, paths: tuple = (), args=(), kwargs=None) -> Key:
    """The family of a call with exact key ``key``; NotGeneric when it keeps exact-shape kernels.

    ``paths`` (:func:`int_paths` of the key's ``args``/``kwargs``) are ints made symbols: the
    family holds them as a marker, not their values.
    """
    if func._schema.is_mutable and any(a.is_out for a in func._schema.arguments):
        raise NotGeneric("out= op (eager resizes its outputs)")
    if torch.Tag.inplace_view in func.tags:
        # NOTE: squeeze_, t_, as_strided_... change their input's sizes in place. Over fake tensors
        # with a ShapeEnv, torch 2.13 segfaults on some (squeeze_ of a dim that is not 1, sizes
        # (5, 1, 5, 1), dim 2: the conformance run found it); the exact trace does not meet it
        raise NotGeneric("an in-place view op (it changes its input's sizes)")
    key_parts = list(key.parts)
    if paths:
        where = _part_indices(args, kwargs or {})
        for path in paths:
            key_parts[where[path]] = ("symint",)
    parts = [("family",)]
    functional = not func._schema.is_mutable
    for p in key_parts:
        if type(p) is tuple and p and type(p[0]) is torch.Size:
            shape, stride, off, dtype, device, conj, neg = p
            if conj or neg:
                raise NotGeneric("a tensor argument has its conj or neg bit set")
            if 0 in shape:
                raise NotGeneric("an empty tensor argument")
            parts.append((len(shape), _layout_class(shape, stride, off, functional), dtype, device))
        else:
            parts.append(p)
    if len(tensors) > 1:
        seen: dict = {}
        for t in tensors:
            ref = StorageWeakRef(t.untyped_storage())
            other = seen.setdefault(ref, t)
            if other is not t:
                raise NotGeneric("two tensor arguments share memory")
    return Key(tuple(parts))


def _same(layout, r, shares: bool) -> bool:
    """Whether a tensor ``r`` has ``layout`` (:meth:`Member.layout`): its shape, the strides
    of dimensions longer than 1 (the ones eager's checks read), its offset where it aliases."""
    shape, stride, offset = layout
    if shape != list(r.shape):
        return False
    if r.numel() > 1 and any(n > 1 and s != rs for n, s, rs in zip(shape, stride, r.stride())):
        return False
    return not shares or offset == r.storage_offset()


def agrees(member: Member, tensors, ref, ints=()) -> bool:
    """Whether ``member``'s outputs at these inputs' sizes are eager's (``ref``: the op's meta
    kernel on this call, :func:`eagerdecomp.exact.reference`)."""
    if ref is None or len(ref.outs) != len(member.metas) or list(ref.shares) != list(member.shares):
        return False
    return _all_same(member, member.layout(tensors, ints), ref.outs)


def matches(member: Member, outs: list, tensors, ints=()) -> bool:
    """Whether a replay's flat outputs ``outs`` are what ``member`` says at these sizes."""
    return len(outs) == len(member.metas) and _all_same(member, member.layout(tensors, ints), outs)


def _all_same(member, layouts, outs) -> bool:
    for layout, r, shares in zip(layouts, outs, member.shares):
        if layout is None or not isinstance(r, torch.Tensor):
            if (layout is None) != (not isinstance(r, torch.Tensor)):
                return False
        elif not _same(layout, r, shares):
            return False
    return True
