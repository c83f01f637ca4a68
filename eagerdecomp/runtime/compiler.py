"""Per-op compiled kernels: a cached kernel's graph handed once to a graph compiler.

Replay runs a decomposition's core ops one by one, so a chain of pointwise ops
costs a pass over memory each. ``compile=`` fuses them: after a key has been
replayed :data:`AFTER` times, its kernel's FX graph goes to the compiler
(``"inductor"``: PyTorch's Inductor on the graph itself, no dynamo; or your own
``compiler(graph_module, example_inputs) -> callable``, as a ``torch.compile``
backend takes), the compiled callable is checked against replay on that call,
and answers the key's later calls. The same callable can serve
``compile_backend(compiler=...)``, so one compiler handles compiled graphs,
graph breaks and eager ops.

It never loses: a kernel that cannot gain or cannot be shown exact stays on
replay, with its reason in the report (``not compiled: ...``), and a compiler
that fails warns once per op. Compiled per exact key: the call's own inputs are
the compiler's example inputs, so nothing shape-generic has to be trusted to a
compiler that does not check guards; a shape seen fewer than :data:`AFTER`
times never pays a compile. Once a key is decided, its calls are served from
C++ (:mod:`eagerdecomp.runtime.hits`): a compiled key's program calls the compiled
code (Inductor's own, directly: :meth:`Compiled.direct`), any other replays.

Example::

    >>> import torch, eagerdecomp as ed
    >>> seen = []
    >>> def my_compiler(gm, example_inputs):   # a backend's graph compiler
    ...     seen.append(len(gm.graph.nodes))
    ...     return gm.forward
    >>> x, y = torch.randn(64), torch.randn(64)
    >>> with ed.EagerDecompMode("core_aten", compile=my_compiler) as m:
    ...     for _ in range(7):   # direct twice, traced, replayed twice, then compiled
    ...         z = torch.logaddexp(x, y)
    >>> len(seen), m.report().row("aten.logaddexp.default").compiled
    (1, 1)
"""

from __future__ import annotations

import operator
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_unflatten

from eagerdecomp.errors import UnsupportedArgumentError
from eagerdecomp.ops import overlap
from eagerdecomp.ops.attribution import warn_as_eager
from eagerdecomp.runtime.observe import log
from eagerdecomp.runtime.recording import RecordingMode

__all__ = ["Compiler", "compiler_for", "plan", "AFTER", "clear"]

# Replays of a key before it is compiled: a key seen once (a shape that changes every call)
# never pays seconds of compilation. EAGERDECOMP_COMPILE_AFTER overrides it.
AFTER = int(os.environ.get("EAGERDECOMP_COMPILE_AFTER", "2"))
# Below both of these a kernel stays on replay (see worth()).
MIN_OPS = 3
MIN_NUMEL = 1 << 14
# Compiled keys per compiler: past this, new keys stay on replay (memory, not correctness).
MAX_COMPILED = 4096
# Values of one key's float (or int) inputs seen once each, none compiled, before the key counts
# as taking new values on most calls (an optimizer's per-step factors): its calls replay in C++.
VARYING = 8


# NOTE: writes through indices the kernel computes stay on replay. Eager checks every index and
# raises; compiled code trusts them: Inductor's code for grid_sampler_2d_backward (index_put with
# accumulate over clamped float coordinates) corrupted the heap on OpInfo's float64 samples and
# aborted the process (the compiled conformance run), where replay gives eager's gradients.
_aten = torch.ops.aten
_INDIRECT_WRITES = frozenset(
    {
        _aten.index_put.default,
        _aten._unsafe_index_put.default,
        _aten.scatter.src,
        _aten.scatter.value,
        _aten.scatter.reduce,
        _aten.scatter.value_reduce,
        _aten.scatter_add.default,
        _aten.scatter_reduce.two,
        _aten.index_add.default,
        _aten.index_copy.default,
        _aten.index_fill.int_Scalar,
        _aten.index_fill.int_Tensor,
        _aten.masked_scatter.default,
        _aten.put.default,
    }
)


@dataclass(frozen=True)
class Declined:
    """Why a kernel (or a key) is not compiled: data, remembered, never retried."""

    reason: str
    # holds for every value of the kernel's non-tensor inputs (a plan or a size rule), not
    # only for this call's (a compiler that failed on them)
    general: bool = True


# Compiler.program_call's answer while a key's verdict is pending: install no program yet
PENDING = type("Pending", (), {"__repr__": lambda self: "PENDING", "__slots__": ()})()


class ByValue:
    """The C++ table's callable for one exact key whose kernel takes non-tensor inputs
    (lifted floats, a shape-generic kernel's ints): the C++ key has the floats' class only,
    and a compiler may bake their values in, so compiled code is looked up by value here.
    A value with none goes back to Python (``hits.MISS``), which counts and compiles it."""

    __slots__ = ("n", "ints", "fns", "miss")

    def __init__(self, n: int, ints: list, miss):
        self.n, self.ints, self.fns, self.miss = n, ints, {}, miss

    def __call__(self, inputs: list):
        if self.ints:
            inputs += self.ints  # C++ passes tensors and lifted floats; the key fixes the ints
        c = self.fns.get(tuple(inputs[self.n :]))
        return self.miss if c is None else c.flat(inputs)

    def program(self):
        """What the C++ program runs: this object, or where every value's code can be called
        directly, ``[n, (values, direct), ...]`` (no Python on a hit of a compiled value)."""
        direct = [] if self.ints else [(values, c.direct()) for values, c in self.fns.items()]
        if direct and all(d is not None and all(type(v) is float for v in values) for values, d in direct):
            return [self.n, *direct]
        return self


class Compiled:
    """A compiled kernel for one exact key: called like :class:`~eagerdecomp.replay.Kernel`."""

    __slots__ = ("fn", "kernel", "plan", "seconds", "versions")

    def __init__(self, fn, kernel, plan, seconds: float):
        self.fn, self.kernel, self.plan, self.seconds = fn, kernel, plan, seconds
        self.versions = None  # fused writes: how far replay advances each written input's version

    def flat(self, inputs) -> list:
        """The op's outputs as replay's graph returns them: checks, compiled code, writes."""
        p = self.plan
        if p.fused and _shares_storage(inputs, p.fused):
            return list(self.kernel.module.forward(*inputs))  # compiled for unaliased inputs: replay this call
        if not p.unshared_ok:  # (with no memory shared, the overlap checks pass as they did at compile time)
            for check, (args, kwargs) in p.checks:
                check(*_fill(args, inputs), **_fill(kwargs, inputs))
        if self.versions is not None:
            # NOTE: the compiled code advances a written input's version as it sees fit (AOTAutograd
            # once, whatever the caller did); eager's count is what replay's copy_ does here
            written = [inputs[i] for i in p.fused]
            want = [t._version + d for t, d in zip(written, self.versions)]
        results = self.fn(*inputs)
        for i, j in p.writes:
            inputs[i].copy_(results[j])
        if self.versions is not None:
            torch._C._autograd._unsafe_set_version_counter(written, want)
        return [inputs[j] if is_input else results[j] for is_input, j in p.outs]

    def direct(self):
        """What a C++ program runs instead of :meth:`flat` (``csrc/hit.cpp``): ``(code, written
        inputs, how far replay advances each one's version, outs)`` with ``outs`` an input index
        or ``-1 - i`` for the code's ``i``-th result; or None where :meth:`flat` must run (Python
        checks, copies into inputs, a compiler's own callable)."""
        p, code = self.plan, getattr(self.fn, "code", None)
        # NOTE: Inductor's CompiledFxGraph.__call__ wraps its generated code in autotune-cache
        # and metrics bookkeeping its first call needs (run's, the check against replay); later
        # calls need the code alone, about 2-3 us a call less
        code = getattr(code, "current_callable", None) or code
        if code is None or p.writes or (p.checks and not p.unshared_ok) or (p.fused and self.versions is None):
            return None
        return code, list(p.fused), list(self.versions or ()), [j if is_input else -1 - j for is_input, j in p.outs]

    def __call__(self, inputs):
        flat = self.flat(inputs)
        k = self.kernel
        for message, category in k.warnings:
            warn_as_eager(message, category)
        return flat[0] if k.single else tree_unflatten(list(flat), k.spec)


def _shares_storage(inputs, written) -> bool:
    """Whether a written input shares memory with another tensor input (or another object of it)."""
    for i in written:
        ptr = inputs[i].untyped_storage().data_ptr()
        if any(
            j != i and isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr
            for j, t in enumerate(inputs)
        ):
            return True
    return False


def _views(op) -> bool:
    return any(a.alias_info is not None and not a.alias_info.is_write for a in op._schema.returns)


@dataclass(frozen=True)
class _In:
    """A check's argument that is the kernel's ``index``-th input."""

    index: int


@dataclass(frozen=True)
class Plan:
    """What is handed to the compiler, and how its results become the op's outputs.

    ``module`` is the kernel's graph made functional: no Python checks (``checks`` run
    before each call instead) and no writes into inputs (``writes`` says which of its
    results is copied into which input after the call; ``outs`` which input object or
    result each output of the op is).
    """

    module: torch.fx.GraphModule
    checks: tuple  # (fn, (args, kwargs)) with _In placeholders
    writes: tuple  # (input index, result index): input.copy_(result) after the call
    outs: tuple  # per output of the op: (True, input index) or (False, result index)
    compute: int  # ops that are not views: fusion saves a memory pass (and a call) each
    fused: tuple = ()  # inputs the compiled code writes itself (fuse_writes): no copy_ after it
    # every check is eager's overlap check of fused inputs against others: with no memory shared
    # it can only fail on internal overlap, which the key's strides fix (it passed at compile time)
    unshared_ok: bool = False


def plan(kernel, fuse_writes: bool = False) -> Plan | Declined:
    """Make ``kernel``'s graph functional for a compiler, or say why it is not worth or not safe to compile.

    NOTE: views stay on replay (their output must share the input's memory, and there is
    nothing to fuse); so do random kernels (a compiler does not keep eagerdecomp's stream).
    Python nodes that compute sizes are traced by the compiler like any other code; Python
    checks with no result (eager's overlap rules for in-place and out=) must run on every
    call, so they come out of the graph and run before the compiled code. A write into an
    input (in-place, out=) comes out too and is done by the same ``copy_`` replay does:
    the compiled code stays functional, so no compiler has to get input mutation, version
    counters or the returned object's identity right.

    ``fuse_writes`` (for Inductor, which handles input mutation): the final ``copy_`` into
    an input stays in the graph, so the compiled code writes the result where it goes in
    the same pass. Such code assumes the written input shares memory with no other input;
    a call where it does runs replay instead (:meth:`Compiled.flat`).
    """
    if kernel.random:
        return Declined("draws random numbers (keeps eagerdecomp's stream)")
    scatter = next((n.target for n in kernel.module.graph.nodes if n.target in _INDIRECT_WRITES), None)
    if scatter is not None:
        return Declined(f"writes through computed indices ({scatter})")
    graph = torch.fx.Graph()
    env, checks, index, written, writes = {}, [], {}, {}, []
    compute = 0
    for node in kernel.module.graph.nodes:
        if any(a in written for a in node.all_input_nodes) and node.op != "output":
            return Declined("reads an input after writing it")
        if node.op == "placeholder":
            index[node] = len(index)
        elif node.op == "output":
            results, outs = [], []
            for o in node.args[0]:
                if not isinstance(o, torch.fx.Node):
                    return Declined(f"returns a constant ({o!r})")
                if o in written:
                    outs.append((True, index[written[o]]))
                else:
                    outs.append((False, len(results)))
                    results.append(env[o])
            w = []
            for dst, value in writes if not fuse_writes else ():  # results, copied in by the wrapper
                w.append((index[dst], len(results)))
                results.append(env[value])
            graph.output(results)
            break
        elif node.op == "call_function" and not isinstance(node.target, OpOverload) and not node.users:
            if node.target is operator.getitem:
                continue  # an output of a multi-output op nothing reads (sort's indices): no effect
            if any(n not in index for n in node.all_input_nodes):
                # NOTE: a check runs before the compiled code, on the call's inputs; one that reads
                # a value the graph computes (masked.median's, over a sort) has nothing to run on
                return Declined(f"checks a computed value ({getattr(node.target, '__name__', node.target)})")
            checks.append((node.target, torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _In(index[n]))))
            continue
        elif node.op == "call_function" and isinstance(node.target, OpOverload):
            target = node.target
            if target._schema.is_mutable:
                if target is not torch.ops.aten.copy_.default or node.args[0].op != "placeholder":
                    return Declined(f"mutates with {target} (only a final copy_ into an input is compiled)")
                written[node] = node.args[0]
                written[node.args[0]] = node.args[0]  # nothing may read the input after the write
                writes.append((node.args[0], node.args[1]))
                compute += 1  # the write is a memory pass: fusion folds the compute before it into one
                if fuse_writes:
                    graph.node_copy(node, lambda n: env[n])  # no users: kept, as a mutation
                continue
            if not _views(target):
                compute += 1
        env[node] = graph.node_copy(node, lambda n: env[n])
    if compute < 2:
        return Declined("one op: nothing to fuse")
    fused = tuple(index[dst] for dst, _ in writes) if fuse_writes else ()
    unshared_ok = bool(fused) and all(
        fn is overlap._replay_check and {d.index for d in args[1]} <= set(fused) for fn, (args, _) in checks
    )
    return Plan(
        torch.fx.GraphModule(kernel.module, graph), tuple(checks), tuple(w), tuple(outs), compute, fused, unshared_ok
    )


def worth(p: Plan, inputs) -> bool:
    """Whether fusion beats replay for this call's sizes (measured with bench/micro.py).

    NOTE: a compiled call has a fixed cost of a few microseconds on CPU, about what replay
    spends on two small ops; so a short graph on small tensors stays on replay, and
    anything longer, or on tensors large enough for memory traffic to dominate, compiles.
    A kernel that writes an input keeps eager's overlap checks and its copy_ either way,
    which dominate on small tensors: it compiles on size alone.
    """
    return (p.compute >= MIN_OPS and not (p.writes or p.fused)) or max(
        (t.numel() for t in inputs if isinstance(t, torch.Tensor)), default=0
    ) >= MIN_NUMEL


def _fill(tree, inputs):
    """``tree`` (a check's arguments) with each :class:`_In` replaced by that input."""
    if type(tree) is _In:
        return inputs[tree.index]
    if isinstance(tree, (tuple, list)):  # fx's immutable_list included: rebuilt as a plain one
        return (tuple if isinstance(tree, tuple) else list)(_fill(a, inputs) for a in tree)
    if isinstance(tree, dict):
        return {k: _fill(v, inputs) for k, v in tree.items()}
    return tree


def _copies(inputs):
    """Inputs with every tensor copied, strides kept (to run a mutating kernel without effect)."""
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            out.append(c.copy_(t))
        else:
            out.append(t)
    return out


def _inductor(gm, example_inputs):
    import torch._functorch.config as functorch_config

    from eagerdecomp.runtime.disk import enabled as disk_enabled
    from eagerdecomp.runtime.paths import cache_dir

    # NOTE: AOTAutograd's cache would answer a later process without Inductor's compile step,
    # whose code _direct calls; Inductor's FX graph cache below still spares it the compiling
    # NOTE: no size asserts in the code: it is compiled for one exact key (sizes, strides and
    # offset are the key's) and only calls with that key reach it; a 3-input kernel's asserts
    # cost about 2 us a call
    options, caches = {"size_asserts": False}, functorch_config.patch(enable_autograd_cache=False)
    if not disk_enabled():
        options["fx_graph_cache"] = False
    else:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        # NOTE: Inductor's own on-disk caches (FX graphs, compiled code) keep a second process
        # from recompiling; under our root they move and clear with every other cache of ours.
        # A directory the user gave Inductor wins; its default (which torch writes into the
        # environment on first use, tracing included) does not.
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir("inductor"))
    import torch._inductor
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # NOTE: fake example inputs with a ShapeEnv (every size static): Inductor's FX graph
    # cache keys on the shape environment and bypasses graphs compiled from real tensors.
    fake = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    inputs = [fake.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    inner = []

    def capture(graph, graph_inputs, **kwargs):
        code = compile_fx_inner(graph, graph_inputs, **kwargs)
        inner.append((graph, code))
        return code

    with torch.no_grad(), caches:
        return _direct(compile_fx(gm, inputs, inner_compile=capture, config_patches=options), inner, gm)


def _direct(wrapped, inner: list, gm):
    """Inductor's compiled code itself, where AOTAutograd handed it our graph unchanged
    (the same inputs and outputs); else ``wrapped``, AOTAutograd's callable.

    NOTE: AOTAutograd's runtime wrapper costs about 2.6 us a call (a hit's whole C++ path
    costs less), and what it does is done here already: the wrapper around compiled code
    (:meth:`Compiled.flat`) sets written inputs' versions and returns input objects, and
    the code runs below autograd. Where AOTAutograd changed the graph's signature (deduped
    inputs, mutations it copies back itself, extra aliased bases) its wrapper is needed,
    and kept. Either way the first call is checked against replay (:meth:`Compiler._make`).
    """
    if len(inner) != 1:  # (a cache hit of AOTAutograd's own, or a forward and a backward)
        return wrapped
    graph, code = inner[0]

    def arity(m):
        nodes = list(m.graph.nodes)
        return sum(n.op == "placeholder" for n in nodes), len(nodes[-1].args[0])

    if arity(graph) != arity(gm) or not callable(code):
        return wrapped

    def run(*args):
        return code(list(args))  # Inductor's calling convention: one list, which it empties

    run.code = code  # (a C++ program calls it with the list itself: Compiled.direct)
    return run


def _resolve(compile) -> tuple:
    if compile == "inductor":
        return "inductor", _inductor
    if callable(compile):
        return getattr(compile, "__name__", type(compile).__name__), compile
    raise UnsupportedArgumentError(
        f"compile must be None, 'inductor' or a callable compiler(graph_module, example_inputs) -> callable, "
        f"got {compile!r}"
    )


def _check(got, want, got_in, want_in) -> str | None:
    """Why a compiled kernel's outputs may not stand in for replay's (None: they may).
    ``got_in``/``want_in``: the inputs each ran on (a written input must come back as itself)."""
    got, want = list(got), list(want)
    if len(got) != len(want):
        return f"returned {len(got)} outputs, replay {len(want)}"
    for g, w in zip(got, want):
        same = [i for i, t in enumerate(want_in) if t is w]
        if same and not any(got_in[i] is g for i in same):
            return "returned a new tensor where replay returns its input object"
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"returned {g!r}, replay {w!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"returned a {type(g).__name__} where replay returns a tensor"
        meta = lambda t: (t.dtype, t.shape, t.device, t.stride() if t.numel() > 1 else None)  # noqa: E731
        if meta(g) != meta(w):
            return f"returned {meta(g)}, replay {meta(w)} (dtype, shape, device, strides)"
        try:
            # NOTE: fusion may round differently (no intermediate rounding, other vector math):
            # within assert_close's default tolerance for the dtype it may stand in; beyond it,
            # it is a different answer, and the op stays on replay.
            torch.testing.assert_close(g, w, equal_nan=True, check_stride=False)
        except AssertionError as e:
            return f"values differ from replay ({str(e).splitlines()[0].strip()})"
    return None


class Compiler:
    """Compiled kernels of one compiler over one kernel cache: key -> :class:`Compiled` or :class:`Declined`."""

    def __init__(self, name: str, fn: Callable, opset=None):
        self.name, self.fn, self.opset = name, fn, opset
        # NOTE: Inductor handles input mutation (fused into the kernel, versions advanced by
        # AOTAutograd); a compiler of the user's gets functional graphs, as documented
        self.fuse_writes = fn is _inductor
        self._table: dict = {}  # key -> Compiled | Declined; read without a lock
        self._hits: dict = {}  # key -> replays so far (a policy counter: approximate under threads)
        self._values: dict = {}  # exact key -> distinct values of its non-tensor inputs seen (same)
        self._kernels: dict = {}  # id(kernel) -> (kernel, plan or Declined, fused-writes plan or None)
        self._by_value: dict = {}  # exact key -> its ByValue, for kernels with non-tensor inputs
        self.hit_table = None  # the C++ table of the runtimes with this compiler (eagerdecomp.runtime.hits)
        self._lock = threading.Lock()
        self._warned: set = set()

    @staticmethod
    def _key(key, kernel, inputs):
        if kernel.ints or any(not isinstance(t, torch.Tensor) for t in inputs):
            # NOTE: lifted floats and int arguments are kernel inputs the key leaves out; a
            # compiler given them as example values may bake them in. Key those by value.
            return (key, tuple(t for t in inputs if not isinstance(t, torch.Tensor)))
        return key

    def program_call(self, key, kernel, inputs, n_tensors: int, n_lifted: int):
        """What the C++ table's program for this exact key runs, once the key's verdict is in:
        ``PENDING`` (no program yet: calls must reach :meth:`lookup`, which counts them),
        None (replay's own steps: the key is not compiled, whatever its values), or a callable
        (compiled code; :class:`ByValue` where the kernel has non-tensor inputs)."""
        vkey = self._key(key, kernel, inputs)
        verdict = self._table.get(vkey)
        if verdict is None and vkey is not key:
            verdict = self._table.get(key)  # (a verdict for every value of the key)
        if verdict is None:
            return PENDING
        if type(verdict) is Declined:  # (one that holds for this call's values only: others may compile)
            return None if verdict.general or vkey is key else PENDING
        if vkey is key:
            return verdict.direct() or verdict.flat
        from eagerdecomp.runtime.hits import MISS

        with self._lock:
            entry = self._by_value.get(key)
            if entry is None:
                entry = self._by_value[key] = ByValue(n_tensors, list(inputs[n_tensors + n_lifted :]), MISS)
            entry.fns[vkey[1]] = verdict
        return entry.program()

    def lookup(self, key, kernel, inputs, stats):
        """The compiled callable for this call, compiling it when the policy says so; or None (replay)."""
        exact, key = key, self._key(key, kernel, inputs)
        entry = self._table.get(key)
        if entry is not None:
            return entry if type(entry) is Compiled else None
        if key is not exact and type(self._table.get(exact)) is Declined:
            return None
        n = self._hits.get(key, 0) + 1
        if n == 1 and len(self._hits) >= 16 * MAX_COMPILED:
            self._hits.clear()  # shapes that change every call: counters of keys that never repeat
            self._values.clear()
        self._hits[key] = n
        if n == 1 and key is not exact:
            seen = self._values[exact] = self._values.get(exact, 0) + 1
            if seen > VARYING and exact not in self._by_value:
                # NOTE: compiled code is per value (a compiler may bake floats in); values that
                # never repeat never reach AFTER, so the key replays, and from C++ (program_call)
                reason = f"its float or int arguments took over {VARYING} values, none compiled"
                stats.not_compiled(kernel.op, reason)
                if len(self._table) < MAX_COMPILED:
                    self._table[exact] = Declined(reason)
                return None
        if n <= AFTER:
            return None
        # NOTE: one compile at a time in the process: Inductor's is not thread-safe (its pattern
        # tables and patchers are global; concurrent compiles fail). A call that finds another
        # compiling replays, and its key is tried again on its next call; never waiting also
        # keeps a compile whose code runs ops back through eagerdecomp from waiting on itself.
        if not _COMPILING.acquire(blocking=False):
            return None
        try:
            if key in self._table:
                return None
            entry = None
            try:
                entry = self._make(kernel, inputs, stats)
            finally:
                with self._lock:
                    if entry is not None and len(self._table) < MAX_COMPILED:
                        self._table[key] = entry
                    self._hits.pop(key, None)
        finally:
            _COMPILING.release()
        return None  # this call replays: its result was the reference the compiled one was checked on

    def _make(self, kernel, inputs, stats):
        verdict = self._kernels.get(id(kernel))
        if verdict is None or verdict[0] is not kernel:
            fused = plan(kernel, fuse_writes=True) if self.fuse_writes else None
            verdict = self._kernels[id(kernel)] = (kernel, plan(kernel), fused if type(fused) is Plan else None)
        p = verdict[1]
        if type(p) is Declined:
            stats.not_compiled(kernel.op, p.reason)
            return p
        if not worth(p, inputs):
            stats.not_compiled(kernel.op, f"replay is as fast at this size (< {MIN_OPS} ops, < {MIN_NUMEL} elements)")
            return Declined("small")
        if verdict[2] is not None and verdict[2].fused and not _shares_storage(inputs, verdict[2].fused):
            p = verdict[2]  # (compiled on inputs that share no memory: the code assumes so)
        written = p.fused or tuple(i for i, _ in p.writes)
        mine, theirs = (_copies(inputs), _copies(inputs)) if written else (list(inputs), list(inputs))
        t0 = time.perf_counter()
        try:
            fn = self.fn(p.module, list(inputs))  # functional (or fused: compiled over fakes), inputs only read
            compiled = Compiled(fn, kernel, p, 0.0)
            theirs_before = [theirs[i]._version for i in written]
            want = kernel.module.forward(*theirs)
            # replay's version count for each written input, in this very context (the mode's)
            advanced = tuple(theirs[i]._version - b for i, b in zip(written, theirs_before))
            if p.fused:
                compiled.versions = advanced
            mine_before = [mine[i]._version for i in written]
            with RecordingMode() as seen:  # what the compiled code calls (Inductor: its extern kernels too)
                got = compiled.flat(mine)
            mine_advanced = tuple(mine[i]._version - b for i, b in zip(written, mine_before))
        except Exception as e:  # noqa: BLE001 - any compiler failure falls back to replay
            return self._decline(
                kernel, stats, f"{self.name} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
        compiled.seconds = time.perf_counter() - t0
        # NOTE: Inductor runs matmuls and some scatters as extern kernels, called by their out= or
        # in-place forms (aten.mm.out, aten.scatter_reduce_.two): outside the opset, so not compiled
        outside = seen.outside(self.opset) if self.opset is not None else []
        bad = f"calls ops outside the opset: {', '.join(outside)}" if outside else None
        bad = bad or _check(got, want, mine, theirs) or _check(mine, theirs, mine, theirs)
        if not bad and mine_advanced != advanced:
            bad = f"advanced the written inputs' versions by {mine_advanced}, replay by {advanced}"
        if bad:
            return self._decline(kernel, stats, f"{self.name} {bad}")
        log.info("%s: compiled by %s in %.2f s", kernel.op, self.name, compiled.seconds)
        stats.compiled(kernel.op, compiled.seconds)
        return compiled

    def _decline(self, kernel, stats, reason):
        if kernel.op not in self._warned:
            self._warned.add(kernel.op)
            warnings.warn(f"eagerdecomp: {kernel.op} stays on replay: {reason}", RuntimeWarning, stacklevel=5)
        stats.not_compiled(kernel.op, reason)
        return Declined(reason, general=False)

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
            self._hits.clear()
            self._values.clear()
            self._kernels.clear()
            self._by_value.clear()
        if self.hit_table is not None:
            self.hit_table.clear()


_COMPILERS: dict = {}  # (id(kernel cache), compiler name, fn) -> Compiler
_LOCK = threading.Lock()
_COMPILING = threading.Lock()  # held by the one compile running in the process (Compiler.lookup)


def compiler_for(cache, compile, opset=None) -> Compiler | None:
    """The process-wide :class:`Compiler` of ``compile`` over ``cache`` (None for ``compile=None``);
    compiled code that calls ops outside ``opset`` (the cache's) is refused."""
    if compile is None:
        return None
    name, fn = _resolve(compile)
    with _LOCK:
        c = _COMPILERS.get((id(cache), name, fn))
        if c is None:
            c = _COMPILERS[id(cache), name, fn] = Compiler(name, fn, opset)
        return c


def clear() -> None:
    """Forget every compiled kernel (with :func:`eagerdecomp.cache_clear`)."""
    with _LOCK:
        for c in _COMPILERS.values():
            c.clear()
