"""Symbolic sizes for shape-generic kernels: fakes with symbolic sizes, sizes as graph
values, and the guard that says which shapes a kernel admits.

A family trace (:mod:`eagerdecomp.trace`) runs a decomposition over fake tensors whose
sizes and strides are symbols of one :class:`ShapeEnv` (PyTorch's own symbolic-shape
machinery, as ``make_fx(tracing_mode="symbolic")`` uses it). Every Python decision the
decomposition, its meta kernels and our exactness checks take on a size becomes a
guard in that ShapeEnv (sizes 0 and 1 are specialized when the fakes are made); the
kernel's :class:`Guard` is the conjunction of all of them, as Python source, over the
placeholders ``t0, t1...`` (so it can be written to disk and read back).

Sizes that reach an op as arguments (``view(x, [s0 * s1])``) become graph values:
:class:`SymGraph` turns a symbolic expression into FX nodes computed from the
placeholders' sizes (plain Python helpers, never dispatched ops: below the mode only
opset ops may run). What it cannot express exactly raises :class:`NotGeneric`, and
the op keeps exact-shape kernels.

NOTE: size-dependent *floats* (``1 / s0``) are refused: sympy reorders float
arithmetic, and a reordered float expression may round differently from eager's.
Integer expressions are exact whatever their order.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading

import torch

__all__ = [
    "NotGeneric",
    "new_shape_env",
    "symbolic_layout",
    "SymGraph",
    "Guard",
    "bindings",
    "evaluate",
    "symbol_sources",
    "symbolic_ints",
    "unguarded",
    "compile_expr",
    "size",
    "stride",
    "offset",
]


class NotGeneric(Exception):
    """This trace cannot be made shape-generic; ``reason`` is reported with the op."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@functools.cache
def _shape_env_class():
    from torch._guards import SLoc
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class _ShapeEnv(ShapeEnv):
        # NOTE: ShapeEnv walks the Python stack for every symbol and guard it makes, to name
        # the user's line in its logs; our guards are read by no one but us. The first walk
        # also imports torch.export and Inductor's modules (to skip their frames): about
        # 0.3 s of a cold process's first shape-generic trace, profiled.
        def _get_stack_summary(self, is_debug=False, framework_loc=None):
            return SLoc(framework_loc or "eagerdecomp", None), ""

    return _ShapeEnv


def new_shape_env():
    # NOTE: no event recording (it exists to replay a ShapeEnv when debugging PyTorch):
    # about a fifth of a family trace's time (mish: 31 -> 25 ms, profiled)
    return _shape_env_class()(should_record_events=False)


def _source(i: int):
    # NOTE: dynamo's LocalSource is what produce_guards prints as L['t0']; importing
    # torch._dynamo costs about a second, once per process, on the first family trace.
    from torch._dynamo.source import LocalSource

    return LocalSource(f"t{i}")


def symbolic_layout(env, tensors: list) -> list:
    """``(sizes, strides, offset)`` of symbols for each ``(i, tensor)``, source ``t{i}``.

    Sizes 0 and 1 come back as plain ints (0/1 specialization); strides are
    expressions of the sizes where the tensor is dense.
    """
    from torch._dynamo.source import TensorProperty, TensorPropertySource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    out = []
    for i, t in tensors:
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim(), dynamic_strides=[DimDynamic.INFER_STRIDE] * t.dim()
        )
        sizes, strides, offset = env.create_symbolic_sizes_strides_storage_offset(t, _source(i), symbolic_context=ctx)
        if t.dim() == 0:
            # NOTE: ShapeEnv keeps the storage offset of a tensor with no dynamic size static; a
            # 0-dim view (x[i] += y[j] in a loop) then had a kernel per offset
            source = TensorPropertySource(_source(i), TensorProperty.STORAGE_OFFSET)
            sym = env.create_symbol(t.storage_offset(), source, dynamic_dim=DimDynamic.DYNAMIC)
            offset = env.create_symintnode(sym, hint=t.storage_offset(), source=source)
        out.append((sizes, strides, offset))
    return out


def symbolic_ints(env, values: list) -> list:
    """A SymInt for each int argument made a symbol (all >= 2), source ``i{j}``."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    out = []
    for j, v in enumerate(values):
        source = LocalSource(f"i{j}")
        sym = env.create_symbol(v, source, dynamic_dim=DimDynamic.DYNAMIC)
        out.append(env.create_symintnode(sym, hint=v, source=source))
    return out


# -- decisions no guard pins -----------------------------------------------------------

_recording = threading.local()


@functools.cache
def _watch_static_decisions() -> None:
    """Wrap the two functions every ``statically_known_true/false`` (Python's and C++'s) goes
    through, so :func:`unguarded` sees the size conditions decided without a guard.

    NOTE: the one place we patch PyTorch. Every other decision on a symbolic size (``bool()``,
    ``guard_or_false``, ``torch._check``...) on our backed symbols becomes a guard, and so part
    of a family's :class:`Guard`; a static query does not: it answers "not known" (False) for
    a condition that a concrete size may make true, where eager's kernel takes the other branch.
    The wrappers only read (and only in a thread inside :func:`unguarded`).
    """
    from torch.fx.experimental import symbolic_shapes as ss

    static_eval, hint_disproves = ss._static_eval_sym_bool, ss._sym_node_hint_disproves

    def _note(node) -> None:
        env = getattr(_recording, "env", None)
        if env is not None and getattr(node, "shape_env", None) is env:
            _recording.notes.append(node.expr)

    def _static_eval_sym_bool(x):
        out = static_eval(x)
        if out is None:
            _note(x.node)
        return out

    def _sym_node_hint_disproves(node, target):
        out = hint_disproves(node, target)
        if out and getattr(_recording, "env", None) is not None:
            from torch import SymBool

            if static_eval(SymBool(node)) is None:  # false here, maybe true at another size
                _note(node)
        return out

    ss._static_eval_sym_bool, ss._sym_node_hint_disproves = _static_eval_sym_bool, _sym_node_hint_disproves


@contextlib.contextmanager
def unguarded(env):
    """Collect (into the yielded list) the conditions on ``env``'s symbols that code run in
    this thread decided by static reasoning alone, without a guard: where a kernel's behaviour
    at one size need not be its behaviour at another size its guard admits."""
    _watch_static_decisions()
    before = getattr(_recording, "env", None), getattr(_recording, "notes", None)
    _recording.env, _recording.notes = env, []
    try:
        yield _recording.notes
    finally:
        _recording.env, _recording.notes = before


# -- reading sizes at replay: plain functions, so nothing is dispatched ---------------------


def size(t, d: int) -> int:
    return t.size(d)


def stride(t, d: int) -> int:
    return t.stride(d)


def offset(t) -> int:
    return t.storage_offset()


def sym_max(*a):
    return max(a)


def sym_min(*a):
    return min(a)


class SymGraph:
    """Turns symbolic ints into FX nodes of ``graph`` (one node per distinct expression)."""

    def __init__(self, graph, env, placeholders: list, ints: list = ()):
        self.graph, self.env, self.placeholders, self.ints = graph, env, placeholders, ints
        self._memo: dict = {}

    def node(self, x):
        """A SymInt as a graph value (an int where it is one)."""
        if isinstance(x, torch.SymInt):
            v = x.node.maybe_as_int()
            if v is not None:
                return v
            return self.expr(x.node.expr)
        raise NotGeneric(f"a size-dependent {type(x).__name__} reaches an op")

    def expr(self, e):
        e = self.env.replace(e)
        hit = self._memo.get(e)
        if hit is not None:
            return hit
        out = self._build(e)
        if not isinstance(out, int):
            self._memo[e] = out
        return out

    def _call(self, fn, *args):
        return self.graph.call_function(fn, tuple(args))

    def _build(self, e):
        import sympy
        from torch.utils._sympy import functions as F

        if isinstance(e, sympy.Integer) or e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            return self._symbol(e)
        args = e.args
        if isinstance(e, sympy.Add):
            return self._chain(operator.add, args)
        if isinstance(e, sympy.Mul):
            return self._chain(operator.mul, args)
        if isinstance(e, (F.FloorDiv, F.CleanDiv)):
            return self._call(operator.floordiv, self.expr(args[0]), self.expr(args[1]))
        if isinstance(e, (F.PythonMod, F.Mod)):
            # NOTE: Mod is made only where both sides are known non-negative, where C's and
            # Python's remainders agree
            return self._call(operator.mod, self.expr(args[0]), self.expr(args[1]))
        if isinstance(e, F.ModularIndexing):
            q = self._call(operator.floordiv, self.expr(args[0]), self.expr(args[1]))
            return self._call(operator.mod, q, self.expr(args[2]))
        if isinstance(e, F.Max):
            return self._call(sym_max, *[self.expr(a) for a in args])
        if isinstance(e, F.Min):
            return self._call(sym_min, *[self.expr(a) for a in args])
        if isinstance(e, (F.PowByNatural, sympy.Pow)) and args[1].is_Integer and int(args[1]) >= 0:
            return self._call(operator.pow, self.expr(args[0]), int(args[1]))
        raise NotGeneric(f"size expression {type(e).__name__} has no exact integer form")

    def _chain(self, fn, args):
        if any(a.is_Rational and not a.is_Integer for a in args):
            raise NotGeneric("size expression with a fraction")
        values = [self.expr(a) for a in args]
        acc = values[0]
        for v in values[1:]:
            acc = self._call(fn, acc, v)
        return acc

    def _symbol(self, s):
        from torch._dynamo.source import TensorProperty, TensorPropertySource

        for src in self.env.var_to_sources.get(s, ()):
            if not isinstance(src, TensorPropertySource) and src.name.startswith("L['i"):
                return self.ints[int(src.name[4:-2])]
            if isinstance(src, TensorPropertySource) and src.base.name.startswith("L['t"):
                i = int(src.base.name[4:-2])
                t = self.placeholders[i]
                if src.prop is TensorProperty.SIZE:
                    return self._call(size, t, src.idx)
                if src.prop is TensorProperty.STRIDE:
                    return self._call(stride, t, src.idx)
                return self._call(offset, t)
        raise NotGeneric(f"size symbol {s} has no input it is read from")


def symbol_sources(env) -> dict:
    """``{symbol name: (tensor index, "size" | "stride" | "offset", dim)}``: plain data."""
    from torch._dynamo.source import TensorProperty, TensorPropertySource

    kinds = {TensorProperty.SIZE: "size", TensorProperty.STRIDE: "stride"}
    out = {}
    for s, sources in env.var_to_sources.items():
        src = sources[0]
        if not isinstance(src, TensorPropertySource):
            if src.name.startswith("L['i"):
                out[str(s)] = (int(src.name[4:-2]), "int", None)
                continue
            raise NotGeneric(f"size symbol {s} is not read from an input")
        out[str(s)] = (int(src.base.name[4:-2]), kinds.get(src.prop, "offset"), src.idx)
    return out


def bindings(sources: dict, tensors, ints=()) -> dict:
    """``{symbol name: value}`` for the symbols of ``sources`` (:func:`symbol_sources`), read
    from ``tensors`` and the int arguments made symbols (``ints``)."""
    out = {}
    for name, (i, kind, d) in sources.items():
        if kind == "int":
            out[name] = ints[i]
            continue
        t = tensors[i]
        out[name] = t.size(d) if kind == "size" else t.stride(d) if kind == "stride" else t.storage_offset()
    return out


def evaluate(e, values: dict) -> int:
    """An int, or a sympy expression of input symbols evaluated at ``values`` (:func:`bindings`)."""
    if isinstance(e, int):
        return e
    return int(e.xreplace({s: values[s.name] for s in e.free_symbols}))


def compile_expr(e):
    """``fn(values) -> int`` for an int or a sympy expression of input symbols: :func:`evaluate`
    without sympy at each call (a new exact key of a family evaluates its output layout:
    xreplace costs tens of microseconds an expression, this a few)."""
    if isinstance(e, int):
        return lambda values: e
    # NOTE: imported here, not at the top: a process that never makes a family (pass-through,
    # exact-shape kernels) does not pay for sympy (seconds on a busy machine); an expression
    # to compile means sympy is loaded already
    import sympy
    from torch.utils._sympy import functions as F

    if e.is_Integer:
        v = int(e)
        return lambda values: v
    if isinstance(e, sympy.Symbol):
        name = e.name
        return lambda values: values[name]
    parts = [compile_expr(a) for a in e.args]
    if isinstance(e, sympy.Add):
        return lambda values: sum(p(values) for p in parts)
    if isinstance(e, sympy.Mul) and not any(a.is_Rational and not a.is_Integer for a in e.args):
        return lambda values: functools.reduce(operator.mul, (p(values) for p in parts))
    ops = {
        F.FloorDiv: lambda a, b: a // b,
        F.CleanDiv: lambda a, b: a // b,
        F.PythonMod: operator.mod,
        F.Mod: operator.mod,
        F.ModularIndexing: lambda a, b, c: (a // b) % c,
        F.Max: max,
        F.Min: min,
    }
    fn = ops.get(type(e))
    if fn is None and isinstance(e, (F.PowByNatural, sympy.Pow)) and e.args[1].is_Integer and e.args[1] >= 0:
        fn = operator.pow
    if fn is None:  # anything else: sympy, exactly as evaluate
        return lambda values: evaluate(e, values)
    return lambda values: fn(*(p(values) for p in parts))


class Guard:
    """The shapes a family kernel admits: Python source over ``L['t0']...``, compiled once.

    Plain data (its source text) so it can be compared and persisted.
    """

    __slots__ = ("source", "_code")

    def __init__(self, source: str | None):
        self.source = source or "True"
        self._code = compile(self.source, "<eagerdecomp guard>", "eval")

    def __call__(self, tensors, ints=()) -> bool:
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        scope = {f"t{i}": t for i, t in enumerate(tensors)}
        scope.update((f"i{j}", v) for j, v in enumerate(ints))
        return bool(eval(self._code, SYMPY_INTERP, {"L": scope}))

    def __eq__(self, other) -> bool:
        return isinstance(other, Guard) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"Guard({self.source})"

    def __reduce__(self):
        return (Guard, (self.source,))
