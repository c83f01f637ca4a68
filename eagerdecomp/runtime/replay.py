"""Replay: run a traced kernel on the real arguments of a call.

A :class:`Kernel` is the FX graph of one op's decomposition for one key. Its
``forward`` takes the call's tensors in key order and returns a flat list;
the op's output structure (tensor, tuple, list) is rebuilt from ``spec``.
In-place and out= ops return their mutated input object because the graph
ends in the ``copy_`` (or placeholder) that *is* that object; views come out
as views because the graph's view ops run on the real inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.fx.node import map_arg
from torch.utils._pytree import tree_unflatten

from eagerdecomp.ops.attribution import warn_as_eager

__all__ = ["Kernel", "Deferred"]


# calls of a deferred kernel that walk its graph before its module is made
INTERPRETED = 2

_RUN_OPS = frozenset({"placeholder", "call_function", "get_attr", "output"})


class Deferred:
    """A kernel's graph and constants whose ``fx.GraphModule`` is made on first use.

    NOTE: a kernel loaded from disk (a kernel bundle, a shape family) often never runs in
    Python: its first call of each exact key runs the key's C++ program, made from the graph
    alone (:mod:`eagerdecomp.runtime.program`). FX's code generation and ``compile`` of its
    forward were most of a bundle's cost in a process's first step, profiled. On the mode's
    C++ key a family's kernel answering a new key runs that call in Python once, before its
    program takes the key over: the first :data:`INTERPRETED` calls walk the graph node by
    node (:meth:`run`: the same calls in the same order), the next one makes the module.
    """

    __slots__ = ("graph", "_constants", "class_name", "_walk", "runs")

    def __init__(self, graph, constants: dict, class_name: str):
        self.graph, self._constants, self.class_name = graph, constants, class_name
        self._walk, self.runs = None, 0

    def run(self, tensors) -> list | None:
        """The graph's outputs for ``tensors``, walked node by node; None once the module
        should be made instead (or the graph holds a node the walk does not take)."""
        if self.runs >= INTERPRETED:
            return None
        self.runs += 1  # (two threads may both count: only which of them walks changes)
        walk = self._walk
        if walk is None:
            walk = self._walk = _walk_of(self.graph)
        if not walk:
            return None
        env: dict = {}
        load, constants, it = env.__getitem__, self._constants, iter(tensors)
        for node, kind, free in walk:
            if kind == "call_function":
                env[node] = node.target(*map_arg(node.args, load), **map_arg(node.kwargs, load))
            elif kind == "placeholder":
                env[node] = next(it)
            elif kind == "get_attr":
                env[node] = constants[node.target]
            else:
                return list(map_arg(node.args[0], load))
            for dead in free:  # (as the generated code deletes a value after its last use)
                del env[dead]
        return None

    def build(self):
        import torch.fx as fx

        module = fx.GraphModule(self._constants, self.graph, class_name=self.class_name)
        module._constants = self._constants
        return module


def _walk_of(graph) -> tuple:
    """``(node, op, values last used there)`` per node; () if a node is not a plain call."""
    nodes = list(graph.nodes)
    if any(n.op not in _RUN_OPS for n in nodes):
        return ()
    last = {}
    for i, n in enumerate(nodes):
        for m in n.all_input_nodes:
            last[m] = i
    frees: list = [[] for _ in nodes]
    for m, i in last.items():
        frees[i].append(m)
    return tuple((n, n.op, tuple(f)) for n, f in zip(nodes, frees))


class Kernel:
    """A cached, replayable decomposition of one op for one key."""

    # ints: paths of the int arguments a shape-generic kernel takes as inputs after the
    # tensors and lifted floats (eagerdecomp.family.int_paths); () for every other kernel
    __slots__ = ("op", "_module", "fn", "spec", "single", "warnings", "leaf_ops", "random", "fixups", "ints", "plans")

    def __init__(self, op, module, spec, warnings_=(), fixups=()):
        """``module``: the ``fx.GraphModule`` replayed, or a :class:`Deferred` one."""
        self.op = op
        self._module = module
        # the generated forward, called directly: skips nn.Module.__call__ and its hooks
        self.fn = None if type(module) is Deferred else module.forward
        self.spec = spec
        self.single = spec.num_leaves == 1 and spec.is_leaf()
        # warnings the op raises on every call (e.g. out= resize) were raised once,
        # while tracing; replay raises them again so eager's behaviour is kept
        self.warnings = tuple(warnings_)
        calls = [n.target for n in self.graph.nodes if n.op == "call_function" and hasattr(n.target, "_schema")]
        self.leaf_ops = tuple(sorted(set(calls), key=str))
        self.random = any("nondeterministic_seeded" in [t.name for t in op.tags] for op in self.leaf_ops)
        self.fixups = tuple(fixups)
        self.ints = ()
        self.plans = {}  # eagerdecomp.program's straight-line plans of this graph, by input count

    @property
    def module(self):
        """The ``fx.GraphModule`` (made now if it was deferred)."""
        module = self._module
        if type(module) is Deferred:
            module = module.build()
            self._module, self.fn = module, module.forward  # (two threads may both build: either is right)
        return module

    @property
    def graph(self):
        """The FX graph, without making a deferred module."""
        return self._module.graph

    @property
    def class_name(self) -> str:
        module = self._module
        return module.class_name if type(module) is Deferred else type(module).__name__

    @property
    def constants(self) -> dict:
        """The tensors the graph reads with ``get_attr``, by name."""
        return self._module._constants

    def __call__(self, tensors: Sequence):
        fn = self.fn
        if fn is not None:
            flat = fn(*tensors)
        else:
            module = self._module
            flat = module.run(tensors) if type(module) is Deferred else None
            if flat is None:
                flat = self.module.forward(*tensors)
        for message, category in self.warnings:
            warn_as_eager(message, category)
        if self.single:
            return flat[0]
        return tree_unflatten(flat, self.spec)

    def __repr__(self) -> str:
        return f"Kernel({self.op}, {len(self.leaf_ops)} leaf ops)"

    @property
    def code(self) -> str:
        """The Python source of the replayed graph (for debugging and reports)."""
        return self.module.code
