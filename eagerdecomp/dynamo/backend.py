"""The ``torch.compile`` backend: captured graphs lowered into the same opset as eager.

``torch.compile`` captures what it can into FX graphs; AOTAutograd turns each
into a forward and a backward graph. This backend lowers both with the *same*
opset and decomposition table that :class:`~eagerdecomp.EagerDecompMode` uses
in eager (built by :func:`~eagerdecomp.runtime.core.runtime_for`, walked by the same
:class:`~eagerdecomp.runtime.lower.Lowerer`; :mod:`~eagerdecomp.dynamo.lowering` keeps
what the graphs receive functional), checks that only opset ops are left, and
then hands each graph to ``compiler`` (your backend compiler) or runs it as it
is. Everything dynamo cannot capture (graph breaks) runs eagerly: under
:class:`~eagerdecomp.EagerDecompMode` it is decomposed by the mode, so both
halves reach only the opset. ``backend="eagerdecomp"`` inside a mode uses that
mode's opset and table (:func:`default_backend`).

Example::

    >>> import torch, eagerdecomp as ed
    >>> def f(x):
    ...     y = torch.nn.functional.silu(x)
    ...     torch._dynamo.graph_break()           # the rest runs eagerly...
    ...     return torch.nn.functional.gelu(y)
    >>> x = torch.randn(8)
    >>> with ed.EagerDecompMode("prims") as mode:  # ...and is decomposed by the mode
    ...     y = torch.compile(f, backend="eagerdecomp")(x)
    ...     backend = ed.dynamo.default_backend()  # the mode's: prims, with the mode's table
    >>> torch.allclose(y, f(x))
    True
    >>> backend.opset == mode.opset, backend.outside_opset()  # every captured graph is in the opset
    (True, [])
"""

from __future__ import annotations

import collections
import functools
import operator
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.utils._python_dispatch import _disable_current_modes

from eagerdecomp.dynamo.lowering import STAND_INS, TRACER_OWNS, lower, lower_leftovers, restore_stand_ins
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.mode import EagerDecompMode
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import routes
from eagerdecomp.runtime.core import runtime_for

__all__ = ["compile_backend", "EagerDecompBackend", "LoweredGraph", "dynamo_backend", "default_backend", "register"]

NAME = "eagerdecomp"

aten = torch.ops.aten

# Graph nodes that are no kernel a backend runs, so they may stay in a lowered graph.
# NOTE: with dynamic shapes AOTAutograd reads sizes off tensors and checks shape
# facts inside the graph; eager never dispatches these as ops.
_SHAPE_NODES = {
    aten.sym_size.int: "reads a symbolic size (dynamic shapes)",
    aten.sym_stride.int: "reads a symbolic stride (dynamic shapes)",
    aten.sym_numel.default: "reads a symbolic numel (dynamic shapes)",
    aten.sym_storage_offset.default: "reads a symbolic storage offset (dynamic shapes)",
    aten._assert_scalar.default: "asserts a shape fact (dynamic shapes)",
    aten.sym_constrain_range_for_size.default: "records a size range (dynamic shapes)",
}


def _is_allowed(target, opset: OpSet, table=None) -> bool:
    if not isinstance(target, OpOverload):
        # operator.getitem on multi-output nodes, operator.mul/torch.sym_* on SymInts:
        # Python arithmetic on sizes, not ops that reach a backend.
        return target is operator.getitem or not isinstance(target, torch._ops.OperatorBase)
    # NOTE: collectives and opaque custom kernels stay in the graph, as in eager (routes.py)
    return target in opset or target in _SHAPE_NODES or routes.passes_through(target, table)


@dataclass
class LoweredGraph:
    """One graph this backend produced: ``kind`` is ``"forward"``, ``"backward"`` or ``"inference"``."""

    kind: str
    graph_module: fx.GraphModule

    def ops(self) -> Counter:
        """``{OpOverload: count}`` of the op nodes in the graph (shape nodes and getitem excluded)."""
        return Counter(
            n.target
            for n in self.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, OpOverload) and n.target not in _SHAPE_NODES
        )


KEEP_GRAPHS = 256


class EagerDecompBackend:
    """A dynamo backend that lowers every captured graph into ``opset``.

    Use :func:`compile_backend` to make one. ``graphs`` holds the last
    :data:`KEEP_GRAPHS` :class:`LoweredGraph` it produced, oldest first (for
    inspection; bounded, so a long-running process that recompiles does not grow).
    """

    def __init__(self, opset="core_aten", compiler: Callable | None = None, decompositions: Mapping | None = None):
        self._setup(runtime_for(opset, decompositions), compiler)  # the eager mode's opset and table, same construction

    @classmethod
    def following(cls, runtime, compiler: Callable | None = None) -> EagerDecompBackend:
        """A backend lowering into ``runtime``'s opset with its very table (a mode's ``mode.runtime``)."""
        backend = cls.__new__(cls)
        backend._setup(runtime, compiler)
        return backend

    def _setup(self, runtime, compiler) -> None:
        self.opset: OpSet = runtime.opset
        self.table: dict = runtime.table
        self.compiler = compiler
        self.graphs: collections.deque = collections.deque(maxlen=KEEP_GRAPHS)
        # AOTAutograd consults its table for every op it traces; each entry starts our Lowerer,
        # which then owns the whole recursive decomposition (cycle guards, bus stops included).
        # (a stand-in is recorded as it is: lowering it would only lead back to it)
        stand_ins = {s for op, s in STAND_INS.items() if op in self.opset}
        self._aot_table = {
            op: functools.partial(lower, op, self.opset, self.table)
            for op in self.table
            if op not in TRACER_OWNS and op not in stand_ins
        }

    def __call__(self, gm: fx.GraphModule, example_inputs, **kwargs):
        from torch._dynamo.backends.common import aot_autograd

        self._add_custom_ops(gm)
        aot = aot_autograd(
            fw_compiler=functools.partial(self._finish, "forward"),
            bw_compiler=functools.partial(self._finish, "backward"),
            inference_compiler=functools.partial(self._finish, "inference"),
            decompositions=self._aot_table,
        )
        return aot(gm, example_inputs, **kwargs)

    def _add_custom_ops(self, gm: fx.GraphModule) -> None:
        # NOTE: custom ops with a Python implementation are decomposed through it, as in eager
        # (routes.py); they are found per graph, since they may be defined after this backend.
        for node in gm.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, (OpOverload, torch._ops.OpOverloadPacket)):
                continue
            overloads = [target] if isinstance(target, OpOverload) else [getattr(target, n) for n in target.overloads()]
            for op in overloads:
                if op in self._aot_table or op in self.opset:
                    continue
                route = routes.custom_route(op, self.table)
                if route is not None and route.name == routes.CUSTOM_IMPL:
                    self._aot_table[op] = functools.partial(lower, op, self.opset, self.table)

    def _finish(self, kind: str, gm: fx.GraphModule, example_inputs):
        from torch._functorch.aot_autograd import make_boxed_func

        # ops AOTAutograd's own passes added after tracing, then the preset's ops for stand-ins
        lower_leftovers(gm, self._allowed, self.opset, self.table)
        restore_stand_ins(gm, self.opset)
        self.validate(gm)
        self.graphs.append(LoweredGraph(kind, gm))
        if self.compiler is None:
            return make_boxed_func(gm.forward)
        # NOTE: AOTAutograd compiles the backward lazily, on the first backward() call, when
        # the user's EagerDecompMode may be active: the user's compiler must not run under it.
        with _disable_current_modes():
            compiled = self.compiler(gm, example_inputs)
        return compiled if getattr(compiled, "_boxed_call", False) else make_boxed_func(compiled)

    def _allowed(self, target) -> bool:
        return _is_allowed(target, self.opset, self.table)

    def validate(self, gm: fx.GraphModule) -> None:
        """Raise :class:`UnsupportedOpError` naming the first op node outside the opset."""
        for node in gm.graph.nodes:
            if node.op == "call_function" and not _is_allowed(node.target, self.opset, self.table):
                raise UnsupportedOpError(
                    node.target,
                    (node.target,),
                    f"left in the compiled graph (node {node.name}) with no decomposition in the table",
                )

    def ops(self) -> Counter:
        """Op nodes of every graph produced so far, counted."""
        total: Counter = Counter()
        for g in self.graphs:
            total.update(g.ops())
        return total

    def outside_opset(self) -> list:
        """Op nodes of the produced graphs that are not in the opset (empty unless validation is bypassed)."""
        return sorted(str(op) for op in self.ops() if not _is_allowed(op, self.opset, self.table))

    def __repr__(self) -> str:
        return f"EagerDecompBackend({self.opset!r}, compiler={self.compiler!r}, graphs={len(self.graphs)})"


def compile_backend(
    opset: str | OpSet | Iterable = "core_aten",
    compiler: Callable | None = None,
    decompositions: Mapping | None = None,
) -> EagerDecompBackend:
    """A ``torch.compile`` backend lowering forward and backward graphs into ``opset``.

    Args:
        opset: as for :class:`~eagerdecomp.EagerDecompMode`; pass the mode's own
            (``mode.opset``) so compiled and eager regions target the same ops.
        compiler: your backend compiler, ``compiler(gm, example_inputs) -> callable``,
            given each lowered graph; ``None`` runs the lowered graph as it is.
        decompositions: extra ``{op: fn}`` entries, as for the mode.

    Example::

        >>> import torch
        >>> from eagerdecomp import compile_backend
        >>> backend = compile_backend("core_aten")
        >>> f = torch.compile(lambda x: torch.nn.functional.silu(x).sum(), backend=backend)
        >>> _ = f(torch.randn(4))
        >>> sorted(str(op) for op in backend.ops())
        ['aten.mul.Tensor', 'aten.sigmoid.default', 'aten.sum.dim_IntList']
    """
    return EagerDecompBackend(opset, compiler, decompositions)


_default: EagerDecompBackend | None = None
_of_mode: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # EagerDecompMode -> its backend


def default_backend() -> EagerDecompBackend:
    """The backend ``torch.compile(backend="eagerdecomp")`` uses now; its ``graphs`` are inspectable.

    Inside an :class:`~eagerdecomp.EagerDecompMode` (the innermost one entered in this
    thread), a backend with that mode's opset and table, one per mode, so compiled and eager
    regions stop at the same ops; outside every mode, core ATen's.

    NOTE: dynamo keeps a compiled frame across modes (it does not guard on ours): a frame
    compiled under one mode and run under another keeps its graphs, whose ops outside the second
    mode's opset that mode decomposes as they run.
    """
    global _default
    mode = EagerDecompMode.active()
    if mode is not None:
        backend = _of_mode.get(mode)
        if backend is None:
            backend = _of_mode[mode] = EagerDecompBackend.following(mode.runtime)
        return backend
    if _default is None:
        _default = EagerDecompBackend("core_aten")
    return _default


def dynamo_backend(gm: fx.GraphModule, example_inputs, **kwargs):
    """What ``torch.compile(backend="eagerdecomp")`` calls: :func:`default_backend`.

    Dynamo finds it through the ``torch_dynamo_backends`` entry point that the package
    declares, so the name resolves without importing anything first; :func:`register`
    does the same by hand (for a source tree that was not installed).
    """
    return default_backend()(gm, example_inputs, **kwargs)


def register() -> None:
    """Register :func:`dynamo_backend` with dynamo under the name ``"eagerdecomp"`` (idempotent)."""
    from torch._dynamo.backends import registry

    if registry._COMPILER_FNS.get(NAME) is not dynamo_backend:
        # NOTE: register_backend refuses a name twice; an entry point loaded earlier may hold it
        registry._COMPILER_FNS.pop(NAME, None)
        registry.register_backend(dynamo_backend, name=NAME)
