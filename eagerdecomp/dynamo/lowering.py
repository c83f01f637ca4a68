"""Lowering inside AOTAutograd's trace, so that what a compiled graph holds is functional.

AOTAutograd traces each captured graph below functionalization and consults the backend's
decomposition table for every op it meets; an entry (:func:`lower`) starts a
:class:`GraphLowerer`, the eager :class:`~eagerdecomp.runtime.lower.Lowerer` whose opset ops
go on to the tracer. AOTAutograd then requires a functional graph (no op whose schema writes,
except ``copy_`` into an input), which eager decompositions do not promise:

* **views whose schema says they write**: ``prims.as_strided`` is declared ``Tensor(a!)``. The
  trace records a functional stand-in with the same result (:data:`STAND_INS`), and
  :func:`restore_stand_ins` puts the preset's op back once AOTAutograd is done with the graph.
* **writes into a tensor the decomposition made** (a padded buffer filled through a view, a
  converted copy: ``prims.copy_to``, ``copy_``): the write becomes a scatter into a new buffer,
  and every tensor of the old buffer is re-pointed, in the trace, at the new one
  (functionalization, for the tensors this decomposition owns). A write into a tensor it was
  given has no functional form: :class:`~eagerdecomp.errors.UnsupportedOpError` names it.

After tracing, AOTAutograd's own passes may add ops the table never saw (with dynamic shapes
its pass that turns symbolic floats into tensors emits ``prims.convert_element_type``,
``aten.true_divide``...): :func:`lower_leftovers` lowers each such node with the same
lowerer and splices the result into the graph.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.runtime import routes
from eagerdecomp.runtime.lower import Lowerer, Stuck

__all__ = ["GraphLowerer", "lower", "STAND_INS", "LEFTOVER_RULES", "lower_leftovers", "restore_stand_ins"]

aten = torch.ops.aten
prims = torch.ops.prims

# Ops AOTAutograd's tracer must see itself: never decomposed while compiling.
# NOTE: the tracer turns a tensor constant (torch.tensor(...) in user code or in a
# decomposition) into a graph constant when it meets lift_fresh; the eager Lowerer
# returns the constant as it is, which would hand a real tensor to the fake trace.
TRACER_OWNS = {aten.lift_fresh.default}

# Opset op -> the functional op the trace records in its place (same result, same aliasing).
# NOTE: prims.as_strided only views its input, but its schema marks the input as written
# (``Tensor(a!)``) and AOTAutograd's functional-graph check rejects any such node;
# aten.as_strided is the same view with a functional schema.
STAND_INS = {prims.as_strided.default: aten.as_strided.default}

# Ops a decomposition may write with; each is turned into a scatter into a new buffer.
# NOTE: prims.copy_to(a, b) and copy_(a, b) both put b's values (converted to a's dtype,
# broadcast to its shape) into a's elements.
_WRITES = {prims.copy_to.default: "copy", aten.copy_.default: "copy"}

# The functional write into a view of a buffer, the opset's own first.
_SCATTERS = (prims.as_strided_scatter.default, aten.as_strided_scatter.default)

# Ops the tracer itself leaves in a graph -> the op whose lowering replaces them.
# NOTE: functionalization turns lift_fresh into lift_fresh_copy: a fresh copy of the
# constant, which is what clone makes (in each opset's own terms once lowered).
LEFTOVER_RULES = {aten.lift_fresh_copy.default: aten.clone.default}


def _storage(t):
    try:
        return StorageWeakRef(t.untyped_storage())
    except (NotImplementedError, RuntimeError):  # sparse and other storage-less layouts
        return None


def _tensors(tree) -> list:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class GraphLowerer(Lowerer):
    """The eager :class:`Lowerer` for AOTAutograd's trace: opset ops go on to the tracer
    (stand-ins for those it rejects), writes into tensors the decomposition made become
    functional, and ops of :data:`TRACER_OWNS` are left to the tracer."""

    def __init__(self, opset, table, inputs=()):
        super().__init__(opset, table, self._emit)
        self.stand_ins = {op: s for op, s in STAND_INS.items() if op in opset}
        self.given = {_storage(t) for t in _tensors(inputs)}
        self.made: dict = {}  # storage -> the tensors of it this lowering made, its allocation first
        # NOTE: prims' own scatter where the opset has it (aten's decomposes through index_put,
        # which pure prims lacks)
        self.scatter = next(op for op in _SCATTERS if op in opset or op is _SCATTERS[-1])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in TRACER_OWNS:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _emit(self, func, args, kwargs):
        if func in _WRITES:
            return self._write(func, args, kwargs)
        if func.namespace in routes.COMPUTE_NAMESPACES and func._schema.is_mutable and func not in self.stand_ins:
            raise Stuck(
                self.chain + [func],
                "writes a tensor inside a decomposition, and AOTAutograd accepts only functional graphs; "
                "register a functional decomposition",
            )
        out = self.stand_ins.get(func, func)(*args, **kwargs)
        for t in _tensors(out):
            ref = _storage(t)
            if ref is not None and ref not in self.given:
                self.made.setdefault(ref, []).append(t)
        return out

    def _write(self, func, args, kwargs):
        dst, src = args[0], args[1]
        owned = self.made.get(_storage(dst))
        if owned is None:
            raise Stuck(
                self.chain + [func],
                "writes a tensor the decomposition was given (a graph value), which a functional graph "
                "cannot express; register a decomposition that returns a new tensor",
            )
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot, set_proxy_slot

        mode = get_proxy_mode()
        if mode is None:
            raise Stuck(self.chain + [func], "a write outside AOTAutograd's trace")
        base = owned[0]
        with self:
            value = src if src.dtype == dst.dtype else aten._to_copy.default(src, dtype=dst.dtype)
            if value.shape != dst.shape:
                value = aten.expand.default(value, dst.shape)
            new = self.scatter(base, value, dst.size(), dst.stride(), dst.storage_offset())
            # every tensor of the old buffer now reads the new one (views: the same view of it)
            for t in owned:
                if t is not base:
                    view = aten.as_strided.default(new, t.size(), t.stride(), t.storage_offset())
                    set_proxy_slot(t, mode.tracer, get_proxy_slot(view, mode.tracer))
        set_proxy_slot(base, mode.tracer, get_proxy_slot(new, mode.tracer))
        return dst


def lower(op, opset, table, *args, **kwargs):
    """Decompose ``op`` inside AOTAutograd's trace, exactly as the eager runtime would."""
    try:
        return GraphLowerer(opset, table, (args, kwargs)).lower(op, args, kwargs)
    except Stuck as e:
        raise UnsupportedOpError(op, e.chain, e.reason) from None


def _is_stand_in(target, opset) -> bool:
    return any(op in opset and s is target and s not in opset for op, s in STAND_INS.items())


def lower_leftovers(gm: fx.GraphModule, allowed, opset, table) -> None:
    """Lower each node AOTAutograd left outside the opset (``allowed(target)`` False) that
    the table or :data:`LEFTOVER_RULES` has a path for, splicing the lowered ops in its place."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        if allowed(node.target) or _is_stand_in(node.target, opset):
            continue
        op = LEFTOVER_RULES.get(node.target, node.target)
        if op in table or op in opset:
            _splice(gm, node, op, opset, table)
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _splice(gm: fx.GraphModule, node: fx.Node, op, opset, table) -> None:
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = tree_flatten((node.args, node.kwargs))
    inputs = [a for a in flat if isinstance(a, fx.Node)]
    values = [a.meta["val"] for a in inputs]

    def run(*xs):
        it = iter(xs)
        args, kwargs = tree_unflatten([next(it) if isinstance(a, fx.Node) else a for a in flat], spec)
        if op in opset:  # a rule's target the opset serves: the op itself
            return op(*args, **kwargs)
        return lower(op, opset, table, *args, **kwargs)

    fake = detect_fake_mode(values)
    with fake if fake is not None else contextlib.nullcontext():
        sub = make_fx(run, tracing_mode="real")(*values)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    with gm.graph.inserting_before(node):
        out = gm.graph.graph_copy(sub.graph, dict(zip(placeholders, inputs)))
    if isinstance(out, fx.Node):
        node.replace_all_uses_with(out)
    else:  # a multi-output op: its users are getitem nodes
        for user in list(node.users):
            user.replace_all_uses_with(out[user.args[1]])
            gm.graph.erase_node(user)
    gm.graph.erase_node(node)


def restore_stand_ins(gm: fx.GraphModule, opset) -> None:
    """Put the preset's op back where the trace recorded a stand-in (:data:`STAND_INS`)."""
    back = {s: op for op, s in STAND_INS.items() if op in opset and s not in opset}
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in back:
            if node.target is aten.as_strided.default:
                _fill_offset(gm, node)
            node.target = back[node.target]
            changed = True
    if changed:
        gm.recompile()


def _fill_offset(gm: fx.GraphModule, node: fx.Node) -> None:
    # NOTE: aten.as_strided defaults its storage offset to its input's; prims.as_strided
    # takes it explicitly (a symbolic one is read off the input inside the graph)
    names = ("self", "size", "stride", "storage_offset")
    src, size, stride, offset = (
        node.args[i] if i < len(node.args) else node.kwargs.get(n) for i, n in enumerate(names)
    )
    if offset is None:
        offset = src.meta["val"].storage_offset()
        if isinstance(offset, torch.SymInt):
            with gm.graph.inserting_before(node):
                offset = gm.graph.call_function(aten.sym_storage_offset.default, (src,))
    node.args, node.kwargs = (src, size, stride, offset), {}
