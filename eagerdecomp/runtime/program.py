"""Programs: a cached kernel specialized to one exact key, for the C++ hit path.

A :class:`~eagerdecomp.replay.Kernel` is an FX graph replayed by Python. Its
*program* is the same computation as a straight-line list of operator calls
that C++ (``csrc/hit.cpp``) runs boxed, with no Python on the way: each call
names its op and its arguments, each argument a constant or a :class:`Slot`
(the call's inputs first: its tensors in key order, then its lifted floats;
then each call's results, in order).

Specializing is cheap, not a trace. A kernel's graph is walked once into a *plan*
(kept on the kernel): its calls, with a :class:`_Hole` wherever a shape-generic kernel
reads a size (:func:`eagerdecomp.symbolic.size` ...) or does integer arithmetic on sizes
in Python; specializing to a key evaluates those few size steps at the key's concrete
sizes and puts the numbers in the holes, so a shape family's new exact key costs
microseconds, not a walk of the graph. The C++ table goes further (:func:`patches`): the
program made at a family's first key is kept (``hit.template``), and each later key copies
it in C++ and remakes only the arguments that hold sizes. What cannot be specialized (a size read from an
intermediate, an op returning a number, warnings to re-raise, outputs that are not
tensors) raises :class:`NoProgram`, and the key stays on Python replay.

Example::

    >>> import torch
    >>> import eagerdecomp as ed
    >>> from eagerdecomp.runtime import hits
    >>> ed.cache_clear()                          # (kernels are cached process-wide)
    >>> mode = ed.EagerDecompMode("core_aten")
    >>> x = torch.randn(8)
    >>> with mode:
    ...     for _ in range(5):
    ...         y = torch.nn.functional.silu(x)   # direct twice, traced, then served by its program
    >>> row = mode.report().row(torch.ops.aten.silu.default)
    >>> row.cpp_hits if hits.enabled() else 2   # C++ hits (0 on the pure-Python path)
    2
"""

from __future__ import annotations

import collections
import functools
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from eagerdecomp.ops import overlap
from eagerdecomp.ops.checks import ONCE
from eagerdecomp.runtime import symbolic

__all__ = ["Slot", "NoProgram", "plan_for", "sizes_at", "filled", "patches"]


class Slot:
    """A value of the program: input ``i`` or an earlier call's result (by number)."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __repr__(self) -> str:
        return f"%{self.i}"


class _ListSlot(Slot):
    """A ``Tensor[]`` result: its items are read with a pick."""


class NoProgram(Exception):
    """This kernel has no straight-line program at this key; ``str(e)`` says why."""


# Plain functions a shape-generic kernel calls on sizes: evaluated once at concrete values.
_EVALUATED = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.neg,
    symbolic.sym_max,
    symbolic.sym_min,
}
_READS = {
    symbolic.size: lambda t, d: t.size(d),
    symbolic.stride: lambda t, d: t.stride(d),
    symbolic.offset: lambda t: t.storage_offset(),
}


# pytree's node types of a flat sequence of outputs (tuple, list, namedtuple, structseq)
_SEQUENCES = {tuple, list, collections.namedtuple, getattr(pytree, "structseq", tuple)}
_RULES = {"internal": 1, "partial": 2, "any": 4}  # csrc/hit.cpp's overlap check reads these bits


@functools.cache  # one entry per aten overload a kernel calls
def _returns(op) -> str:
    """``"tensors"`` (n Tensor returns), ``"list"`` (one Tensor[]), or why not."""
    kinds = {str(r.type) for r in op._schema.returns}
    if not kinds or kinds == {"Tensor"}:
        return "tensors"
    if kinds == {"List[Tensor]"} and len(op._schema.returns) == 1:
        return "list"
    return f"{op} returns {', '.join(sorted(kinds))}"


class _Hole:
    """A size value of a plan, filled at each key: ``plan.sizes[j]``'s result."""

    __slots__ = ("j",)

    def __init__(self, j: int):
        self.j = j


def plan_for(kernel, n_tensors: int, n_lifted: int) -> tuple:
    """The kernel's plan (made once and kept on it); raises :class:`NoProgram`."""
    plan = kernel.plans.get((n_tensors, n_lifted))
    if plan is None:
        try:
            plan = _plan(kernel, n_tensors, n_lifted)
        except NoProgram as e:
            plan = str(e)  # NOTE: a plan is data: the reason, not the exception (it holds frames)
        kernel.plans[n_tensors, n_lifted] = plan
    if type(plan) is str:
        raise NoProgram(plan)
    return plan


def sizes_at(plan, tensors, ints=()) -> list:
    """The plan's size values at these inputs (and int arguments)."""
    values: list = []
    for step in plan[0]:  # in graph order: a step reads only earlier values
        values.append(_size_step(step, tensors, ints, values))
    return values


def filled(plan, values) -> tuple:
    """``(calls, outputs, n_slots)``: the plan's program at one key, ``values`` (:func:`sizes_at`)
    in its holes.

    ``calls``: ``("call", name, overload, args, kwargs, first_slot, n_results)`` per op call,
    ``("pick", list_slot, index, slot)`` for an item of a ``Tensor[]`` result, and
    ``("check", rules, dest_slots, input_slots)`` for eager's overlap check of an in-place or
    out= op (:mod:`eagerdecomp.overlap`: whether two tensors share memory is not in the key).
    ``outputs``: the slot number of each flat output.
    """
    _, calls, holed, outputs, n_slots, _ = plan
    calls = list(calls)
    for c in holed:
        calls[c] = _fill(calls[c], values)
    return calls, outputs, n_slots


def patches(plan, values) -> list:
    """``[(call index, argument position or keyword name, value)]``: only the arguments that
    hold sizes, filled (a program made at another key of the plan is patched with them)."""
    return [(c, where, _fill(arg, values)) for c, where, arg in plan[5]]


def _size_step(step, tensors, ints, values):
    kind, fn, args = step
    if kind == "int":
        return ints[args]
    args = _fill(args, values)
    return fn(tensors[args[0]], *args[1:]) if kind == "read" else fn(*args)


def _fill(x, values):
    t = type(x)
    if t is _Hole:
        return values[x.j]
    if t is list or t is tuple:  # the plan's own containers (a constant's type is kept)
        return t(_fill(y, values) for y in x)
    if t is dict:
        return {k: _fill(v, values) for k, v in x.items()}
    return x


def _has_hole(x) -> bool:
    t = type(x)
    if t is list or t is tuple:
        return any(_has_hole(y) for y in x)
    if t is dict:
        return any(_has_hole(v) for v in x.values())
    return t is _Hole


def _plan(kernel, n_tensors: int, n_lifted: int) -> tuple:
    """``(size steps, calls, indices of calls with holes, outputs, n_slots, size arguments)``:
    the graph walked once."""
    if kernel.warnings:
        raise NoProgram("it re-raises warnings on replay")
    if kernel.op in ONCE:
        raise NoProgram("eager's once-per-process warning is asked for on each call")
    spec = kernel.spec
    children = spec.children() if hasattr(spec, "children") else spec.children_specs  # torch < 2.12
    # a namedtuple (return_types) comes back as a plain tuple, as any dispatch mode's does
    flat_seq = spec.type in _SEQUENCES or isinstance(spec.type, type) and issubclass(spec.type, tuple)
    if not (kernel.single or flat_seq and all(c.is_leaf() for c in children)):
        raise NoProgram("nested output structure")
    env: dict = {}
    calls: list = []
    sizes: list = []
    n = n_tensors + n_lifted
    inputs = iter(range(n))

    def value(x):
        if isinstance(x, fx.Node):
            return env[x]
        if isinstance(x, (list, tuple)):  # FX keeps its own immutable list and tuple types
            return (tuple if isinstance(x, tuple) else list)(value(y) for y in x)
        return x

    def sized(step) -> _Hole:
        sizes.append(step)
        return _Hole(len(sizes) - 1)

    def known(x) -> bool:  # a constant or a size: not a value computed at run time
        if isinstance(x, Slot):
            return False
        if isinstance(x, (list, tuple)):
            return all(known(y) for y in x)
        return True

    for node in kernel.graph.nodes:
        if node.op == "placeholder":
            if node.name.startswith("i"):
                env[node] = sized(("int", None, int(node.name[1:])))
            else:
                env[node] = Slot(next(inputs))
        elif node.op == "get_attr":
            env[node] = kernel.constants[node.target]
        elif node.op == "call_function":
            target = node.target
            args, kwargs = value(node.args), {k: value(v) for k, v in node.kwargs.items()}
            if isinstance(target, torch._ops.OpOverload):
                kind = _returns(target)
                if kind == "list":
                    env[node] = _ListSlot(n)
                    count = 1
                elif kind == "tensors":
                    count = len(target._schema.returns)
                    env[node] = Slot(n) if count == 1 else tuple(Slot(n + j) for j in range(count))
                else:
                    raise NoProgram(kind)
                calls.append(("call", target._schema.name, target._schema.overload_name, args, kwargs, n, count))
                n += count
            elif target is operator.getitem and isinstance(args[0], _ListSlot):
                calls.append(("pick", args[0].i, args[1], n))
                env[node] = Slot(n)
                n += 1
            elif target is operator.getitem and type(args[0]) is tuple:
                env[node] = args[0][args[1]]
            elif target is overlap._replay_check and all(isinstance(x, Slot) for x in (*args[1], *args[2])):
                mask = sum(_RULES[r] for r in args[0])
                calls.append(("check", mask, [x.i for x in args[1]], [x.i for x in args[2]]))
            elif target in _READS and isinstance(args[0], Slot) and args[0].i < n_tensors and known(args[1:]):
                env[node] = sized(("read", _READS[target], (args[0].i, *args[1:])))
            elif target in _EVALUATED and known(args) and not kwargs:
                env[node] = sized(("eval", target, args))
            else:
                raise NoProgram(f"calls {getattr(target, '__name__', target)} on values known only at run time")
        elif node.op == "output":
            flat = value(node.args[0])
            if not all(type(o) is Slot for o in flat):
                raise NoProgram("an output is not a tensor the program computes")
            holed = tuple(i for i, c in enumerate(calls) if _has_hole(c))
            sites = []  # (call, argument position or keyword name, argument) of each size argument
            for i in holed:
                if calls[i][0] != "call":  # (a pick of a computed index: made whole at each key)
                    sites = None
                    break
                _, _, _, args, kwargs, _, _ = calls[i]
                sites += [(i, k, a) for k, a in enumerate(args) if _has_hole(a)]
                sites += [(i, k, a) for k, a in kwargs.items() if _has_hole(a)]
            return tuple(sizes), tuple(calls), holed, [o.i for o in flat], n, sites and tuple(sites)
    raise NoProgram("the graph has no output")
