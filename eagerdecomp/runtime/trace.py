"""Trace one op's decomposition, once, into an FX kernel over fake tensors.

Tracing runs on fake tensors so no data value is baked in and nothing is
executed for real (an in-place op is applied once, on its real call, and no
random numbers are drawn). The :class:`~eagerdecomp.runtime.lower.Lowerer` records
every opset op it reaches as a graph node; :mod:`eagerdecomp.exact` then checks
the outputs against the op's own meta kernel and adds the fix-ups that make
the kernel eager-exact.
"""

from __future__ import annotations

import contextlib
import itertools
import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from eagerdecomp.errors import MismatchError, TraceError, UnsupportedOpError
from eagerdecomp.runtime import metaref
from eagerdecomp.runtime.exact import (
    check_devices,
    concrete_fake_mode,
    eager_reference,
    fakes_like,
    fakes_of,
    finish_outputs,
    metas_like,
    new_fake_mode,
    plain,
    reference,
    swap_tensors,
)
from eagerdecomp.runtime.family import Member, out_meta, read_ints
from eagerdecomp.runtime.key import Bypass
from eagerdecomp.runtime.lift import LiftRefused, same_kernel, stand_ins, with_values
from eagerdecomp.runtime.lower import Lowerer, Stuck
from eagerdecomp.runtime.quiet import forward, issue_once, quiet
from eagerdecomp.runtime.replay import Deferred, Kernel
from eagerdecomp.runtime.symbolic import (
    Guard,
    NotGeneric,
    SymGraph,
    new_shape_env,
    symbol_sources,
    symbolic_ints,
    symbolic_layout,
    unguarded,
)

__all__ = ["trace", "trace_family", "traced"]

_traces = itertools.count()  # traces started in this process (next() is atomic under the GIL)


def traced() -> int:
    """Traces started in this process, exact and shape-generic (``cache_info().traced``)."""
    return _traces.__reduce__()[1][0]


aten = torch.ops.aten
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


class _Emitter:
    """``emit`` for tracing: run the op on fakes and record it as a graph node."""

    def __init__(self, fake_mode: FakeTensorMode):
        self.fake_mode = fake_mode
        self.graph = fx.Graph()
        self.env: dict = {}  # id(fake) -> (fake, node); the fake is kept alive so ids stay unique
        self.constants: dict = {}
        self.scalars: dict = {}  # stand-in value of a lifted float -> its placeholder
        self.sym = None  # a SymGraph in a family trace: symbolic sizes -> graph values
        self.inputs: list = []  # placeholder nodes, in key order
        self.concrete = fake_mode.shape_env is None  # (sizes are ints: no symbolic reasoning to keep)

    def placeholder(self, fake, i: int) -> None:
        node = self.graph.placeholder(f"t{i}")
        self.inputs.append(node)
        self.env[id(fake)] = (fake, node)

    def scalar_placeholder(self, value: float, i: int) -> None:
        self.scalars[value] = self.graph.placeholder(f"s{i}")

    def node(self, x):
        if type(x) is float:
            return self.scalars.get(x, x)
        if isinstance(x, _SYM):
            if self.sym is None:
                raise TraceError(f"a symbolic size reached an exact-shape trace: {x}")
            return self.sym.node(x)
        hit = self.env.get(id(x))
        if hit is not None:
            return hit[1]
        if isinstance(x, FakeTensor):
            raise TraceError(f"a fake tensor reached an opset op without passing through the trace: {x}")
        # a real tensor: a constant a decomposition made with torch.tensor(); bake it in
        name = f"c{len(self.constants)}"
        self.constants[name] = x
        fake = self.fake_mode.from_tensor(x)
        node = self.graph.get_attr(name)
        self.env[id(x)] = (x, node)
        self.env[id(fake)] = (fake, node)
        return node

    def _fake(self, x):
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            self.node(x)
            return self.fake_mode.from_tensor(x)
        return x

    def value(self, x):
        """``x`` (an argument: tensors, sizes, lists of them) as graph values."""
        return self._map(self.node, x)

    def _map(self, fn, x):
        if isinstance(x, torch.Tensor) or type(x) is float or isinstance(x, _SYM):
            return fn(x)
        if type(x) is list or type(x) is tuple:
            return type(x)(self._map(fn, y) for y in x)
        return x

    def __call__(self, func, args, kwargs):
        nargs = self._map(self.node, args)
        nkwargs = {k: self._map(self.node, v) for k, v in kwargs.items()}
        fargs, fkwargs = self._map(self._fake, args), {k: self._map(self._fake, v) for k, v in kwargs.items()}
        quick = None
        if self.concrete and metaref.applies(func):  # (the fake mode's meta leg alone: metaref.py)
            quick = metaref.answer(func, fargs, fkwargs, self.fake_mode, decompose=False)
        if quick is not None:
            out = quick[0]
            forward(quick[1])
        else:
            out = func(*fargs, **fkwargs)
        self.bind(out, self.graph.call_function(func, nargs, nkwargs))
        return out

    def record_check(self, fn, rules, dests, inputs) -> None:
        """Record ``fn(rules, dests, inputs)`` into the kernel, to run at every replay: eager's
        overlap checks read memory the key does not hold (:mod:`eagerdecomp.ops.overlap`)."""
        if all(id(t) in self.env for t in dests + inputs):
            nodes = [self.node(t) for t in dests], [self.node(t) for t in inputs]
            self.graph.call_function(fn, (tuple(sorted(rules)), *nodes))

    def bind(self, out, node) -> None:
        if isinstance(out, torch.Tensor):
            self.env[id(out)] = (out, node)
        elif type(out) is list or type(out) is tuple:
            for i, o in enumerate(out):
                if isinstance(o, (torch.Tensor, list, tuple)):
                    self.bind(o, self.graph.call_function(operator.getitem, (node, i)))


class _LoweredFixups:
    """The emitter :func:`~eagerdecomp.runtime.exact.finish_outputs` writes its fix-ups with
    (a clone, an ``empty_strided`` + ``copy_`` giving eager's strides), each op lowered into the
    opset like the decomposition's own.

    NOTE: core ATen holds every fix-up op, prims does not (``aten.empty_strided``, ``aten.clone``):
    emitted as they were, they reached a prims backend's kernels.
    """

    def __init__(self, emitter: _Emitter, lowerer: Lowerer):
        self._emitter, self._lowerer = emitter, lowerer

    def __getattr__(self, name):
        return getattr(self._emitter, name)

    def __call__(self, func, args, kwargs):
        if func in self._lowerer.opset:
            return self._emitter(func, args, kwargs)
        mode = self._emitter.fake_mode
        active = mode in _get_current_dispatch_mode_stack()
        with contextlib.nullcontext() if active else mode:
            return self._lowerer.lower(func, args, kwargs)


def _with_values(args, kwargs, lifted, values):
    return with_values(args, kwargs, lifted, values)  # list elements too: lift.py owns positions


def trace(func, args: tuple, kwargs: dict, tensors: list, opset, table, lifted=(), known=None) -> Kernel:
    """Trace ``func(*args, **kwargs)``'s decomposition into a :class:`Kernel` for this exact key.

    ``tensors`` are the call's tensors in key order (:func:`~eagerdecomp.key.make_key`);
    ``lifted`` the ``(position, value)`` of floats to make kernel inputs (see
    :mod:`eagerdecomp.lift`): the kernel then takes ``(*tensors, *values)``.
    Raises :class:`~eagerdecomp.key.Bypass` when the call cannot be replayed,
    :class:`LiftRefused` when its lifted floats change the graph, and
    :class:`UnsupportedOpError` when it has no path to ``opset``. ``known``: eager's metadata
    for this key, taken at its direct calls (:mod:`eagerdecomp.runtime.tiers`), or None.
    """
    next(_traces)
    check_devices(func, tensors, args, kwargs)
    with _disable_current_modes():  # nothing below our mode may see tracing
        ref, refusal = eager_reference(func, args, kwargs, tensors, known)
        try:
            if not lifted:
                kernel = _trace_once(func, args, kwargs, tensors, opset, table, ref, ())
            else:
                kernels = []
                for which in (0, 1):
                    values = stand_ins(lifted, which)
                    a, k = _with_values(args, kwargs, lifted, values)
                    kernels.append(_trace_once(func, a, k, tensors, opset, table, ref, values))
                if not same_kernel(*kernels):
                    raise LiftRefused(f"{func}: its graph depends on the value of a float argument")
                kernel = kernels[0]
        except UnsupportedOpError:
            if refusal is not None:  # declined arguments eager refuses: eager's error, not "no path"
                raise refusal.error from None
            raise
    if refusal is not None:  # the decomposition computes something where eager refuses
        raise refusal.error
    return kernel


def trace_family(func, args: tuple, kwargs: dict, tensors: list, opset, table, lifted=(), paths=()) -> Member:
    """Trace a shape-generic kernel for this call's family: a :class:`~eagerdecomp.family.Member`.

    As :func:`trace`, over fakes whose sizes are symbols; the guard admits every shape on
    which the decomposition, its meta kernels and the exactness checks decide alike.
    ``paths`` (:func:`~eagerdecomp.family.int_paths`) are int arguments made symbols too: the
    kernel then takes ``(*tensors, *lifted values, *those ints)``.
    Raises :class:`NotGeneric` (or any error :func:`trace` raises) when it cannot make
    one: the caller then traces an exact-shape kernel.
    """
    next(_traces)
    check_devices(func, tensors, args, kwargs)
    try:
        return _trace_family(func, args, kwargs, tensors, opset, table, lifted, paths)
    except (NotGeneric, Bypass, UnsupportedOpError, MismatchError, TraceError, LiftRefused):
        raise
    except Exception as e:  # noqa: BLE001 - symbolic machinery met something it cannot do: exact kernels
        raise NotGeneric(f"symbolic trace failed: {type(e).__name__}") from e


def _trace_family(func, args, kwargs, tensors, opset, table, lifted, paths) -> Member:
    with _disable_current_modes():
        if not lifted:
            return _trace_generic(func, args, kwargs, tensors, opset, table, (), paths)
        members = []
        for which in (0, 1):
            values = stand_ins(lifted, which)
            a, k = _with_values(args, kwargs, lifted, values)
            members.append(_trace_generic(func, a, k, tensors, opset, table, values, paths))
        first, second = members
        if first.guard != second.guard or not same_kernel(first.kernel, second.kernel):
            raise NotGeneric("its graph or guard depends on the value of a float argument")
        return first


def _with_ints(args, kwargs, paths, syms):
    a, k = list(args), dict(kwargs)
    for (pos, i), sym in zip(paths, syms):
        holder = a if type(pos) is int else k
        if i is None:
            holder[pos] = sym
        else:
            seq = list(holder[pos])
            seq[i] = sym
            holder[pos] = type(holder[pos])(seq)
    return tuple(a), k


def _trace_generic(func, args, kwargs, tensors, opset, table, scalars, paths=()) -> Member:
    env = new_shape_env()
    syms = symbolic_ints(env, read_ints(paths, args, kwargs)) if paths else []
    if paths:
        args, kwargs = _with_ints(args, kwargs, paths, syms)
    # NOTE: a repeated object keeps its first occurrence's symbols (source t{first index})
    first: dict = {}
    for i, t in enumerate(tensors):
        first.setdefault(id(t), i)
    made = dict(zip(first.values(), symbolic_layout(env, [(i, tensors[i]) for i in first.values()])))
    layouts = [made[first[id(t)]] for t in tensors]
    # NOTE: one fake mode and one set of metas serve the reference, the guard's placeholders and
    # the trace, each with fakes of its own (made twice per trace, modes and metas were a
    # quarter of a trace's set-up: FakeTensorMode() walks the Python stack, and a meta with
    # symbolic sizes reasons about its layout in sympy)
    metas = metas_like(tensors, layouts)
    fake_mode = new_fake_mode(env, tensors)
    with unguarded(env) as undecided:
        ref = reference(func, args, kwargs, fake_mode, fakes_of(fake_mode, tensors, metas))
    if ref is None:
        raise NotGeneric("no meta kernel to check other shapes against")
    placeholders = fakes_of(fake_mode, tensors, metas)  # untouched by the call, for the guard
    fakes = fakes_of(fake_mode, tensors, metas)
    finals: list = []
    kernel = _trace_once(
        func, args, kwargs, tensors, opset, table, ref, scalars, fake_mode, fakes, env, finals, len(paths)
    )
    kernel.ints = tuple(paths)
    guard = Guard(_guard_source(env, placeholders, syms))
    # NOTE: what the kernel returns (after its fix-ups), not what the meta kernel said: at a
    # new shape the two are compared with eager's meta kernel (family.agrees)
    metas = tuple(out_meta(env, o) for o in finals)
    storages = {StorageWeakRef(f.untyped_storage()) for f in fakes}
    shares = tuple(isinstance(o, torch.Tensor) and StorageWeakRef(o.untyped_storage()) in storages for o in finals)
    return Member(kernel, guard, symbol_sources(env), metas, shares, _unproven(env, ref, metas, shares, undecided))


def _unproven(env, ref, metas, shares, undecided) -> str | None:
    """Why this member cannot be proved eager-exact at every shape its guard admits; None when
    it is: eager's meta kernel, run over the same symbols, decided nothing on a size without a
    guard and returned the member's layout and aliasing, as expressions."""
    if undecided:
        return f"eager's meta kernel decided {undecided[0]} without a guard"
    if list(ref.shares) != list(shares) or len(ref.outs) != len(metas):
        return "its outputs alias inputs where eager's do not"
    for r, m, aliases in zip(ref.outs, metas, shares):
        e = out_meta(env, r)
        if e is None or m is None:
            if (e is None) != (m is None):
                return "an output is a tensor where eager's is not"
            continue
        # NOTE: as eager's checks: the strides of dimensions that may be longer than 1, the
        # offset of an output that aliases an input
        pairs = list(zip(e[0], m[0])) + [(a, b) for n, a, b in zip(m[0], e[1], m[1]) if n != 1]
        if aliases:
            pairs.append((e[2], m[2]))
        if len(e[0]) != len(m[0]) or not all(_equal(env, a, b) for a, b in pairs):
            return "its output layout equals eager's only at some shapes"
    return None


def _equal(env, a, b) -> bool:
    import sympy  # only symbolic traces get here: import eagerdecomp does not load sympy

    return a == b or env._maybe_evaluate_static(sympy.Eq(a, b)) == sympy.true


def _guard_source(env, placeholders, ints) -> str:
    from torch._dynamo.source import LocalSource

    names = [f"t{i}" for i in range(len(placeholders))] + [f"i{j}" for j in range(len(ints))]
    guards = env.produce_guards(list(placeholders) + list(ints), [LocalSource(n) for n in names], ignore_static=False)
    return " and ".join(guards) if guards else "True"


def _trace_once(
    func, args, kwargs, tensors, opset, table, ref, scalars, fake_mode=None, fakes=None, env=None, finals=None, n_ints=0
) -> Kernel:
    if fake_mode is None and plain(tensors):
        # NOTE: this thread's fake mode and fakes built from sizes and strides, as a direct call's
        # reference and a family trace take them: a fresh mode and from_tensor were a quarter
        # of an exact trace's time
        fake_mode = concrete_fake_mode(tensors)
        fakes = fakes_like(fake_mode, tensors)
    elif fake_mode is None:  # (tensors that share memory or carry math bits: from_tensor knows them)
        fake_mode = new_fake_mode(tensors=tensors)
        fakes = [fake_mode.from_tensor(t) for t in tensors]
    emitter = _Emitter(fake_mode)
    for i, f in enumerate(fakes):
        emitter.placeholder(f, i)
    for i, v in enumerate(scalars):
        emitter.scalar_placeholder(v, i)
    if env is not None:
        ints = [emitter.graph.placeholder(f"i{j}") for j in range(n_ints)]
        emitter.sym = SymGraph(emitter.graph, env, emitter.inputs, ints)
    it = iter(fakes)
    fargs = swap_tensors(args, it)
    fkwargs = {k: swap_tensors(v, it) for k, v in kwargs.items()}
    lowerer = Lowerer(opset, table, emitter)
    try:
        # NOTE: only the warning eager raises on every call (an out= tensor resized) is kept
        # for replay; anything else raised while tracing, such as deprecations inside torch's
        # decompositions, is an artifact of tracing and dropped (see eagerdecomp.quiet).
        with quiet() as caught, fake_mode:
            out = lowerer.lower(func, fargs, fkwargs)
    except Stuck as e:
        raise UnsupportedOpError(func, e.chain, e.reason) from None
    except RecursionError:
        raise UnsupportedOpError(func, lowerer.chain, "decomposition recursed past Python's limit") from None
    except DataDependentOutputException:
        raise Bypass("needs a data value") from None
    except DynamicOutputShapeException:
        raise Bypass("dynamic output shape") from None
    except (MismatchError, TraceError, NotGeneric):
        raise
    except Exception as e:  # noqa: BLE001
        if env is not None:
            # a symbolic size met something that needs a concrete one (a data-dependent guard,
            # a kernel without symbolic support): the exact-shape trace decides what the call is
            raise NotGeneric(f"symbolic trace failed: {type(e).__name__}") from e
        # fake tensors cannot run it (or the call is invalid): decompose eagerly instead,
        # where a genuine argument error surfaces exactly as the decomposition raises it
        raise Bypass(f"trace failed: {type(e).__name__}") from e
    flat_out, spec = tree_flatten(out)
    fixups: list = []
    try:
        nodes = finish_outputs(func, _LoweredFixups(emitter, lowerer), fargs, fkwargs, flat_out, ref, fixups, finals)
    except Stuck as e:
        raise UnsupportedOpError(func, [func] + e.chain, e.reason) from None
    emitter.graph.output(nodes)
    # NOTE: FX keeps each generated module's source for tracebacks under a fresh file name, for
    # the life of the process; one name per op keeps that bounded (a traceback may then show
    # another kernel's source of the same op).
    emitter.graph._co_fields = {"co_filename": f"<eagerdecomp kernel {func}>"}
    # NOTE: the module (FX's code generation and compile, ~1 ms) is made only if the kernel runs
    # in Python past its first calls: on the C++ paths a key's program, made from the graph, runs it
    module = Deferred(emitter.graph, emitter.constants, f"Kernel_{func.__name__.replace('.', '_')}")
    # (a once-per-process warning fired for this call: raised now, never replayed)
    return Kernel(func, module, spec, [(text, UserWarning) for text in issue_once(caught)], fixups)
