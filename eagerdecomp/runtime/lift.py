"""Scalar lifting: one kernel for every ordinary value of a float operand.

Keys hold scalars by value, so an op called with ever-changing floats (AdamW's
``addcdiv_(..., value=-step_size)``, a learning-rate schedule) would trace a
kernel per value. For pointwise ops, a float argument is instead *lifted*: the
key holds only its value class, and the kernel takes the value as an input.

Lifting must never change a result, so it is earned, not assumed:

* only ops tagged ``pointwise`` are tried (and ``_foreach_*`` ops that map a
  pointwise op over their lists), and only their ``float``/``number`` arguments
  that arrive as Python floats, and the float elements of their ``float[]`` /
  ``Scalar[]`` arguments (AdamW's per-parameter step sizes): each element is lifted
  as a float of its own;
* special values (0, +-1, +-0.5, +-2, nan, +-inf) are never lifted: decompositions
  branch on them, so they keep a kernel of their own, keyed by value; so are floats
  that round to one in float32, the precision a float32 kernel sees them in;
* a value class is (sign, magnitude band), the bands split at 0.5 and 1, so range
  checks such as ``0 <= p <= 1`` see a representative value, and so do branches
  at 0.5 (lerp's, which picks its formula by ``|weight| < 0.5``);
* the kernel is traced twice, with stand-ins at the two far ends of the class
  (2**-20 and 0.5 - 2**-20; 0.5 + 2**-20 and 1 - 2**-20; 1 + 2**-20 and 2**20); the
  two graphs (code and constants) must be identical once the stand-ins are inputs.
  A Python branch on any threshold inside the class, or a value computed with into
  a baked constant, makes them differ, and that key falls back to keys by value.
  What remains unchecked is a branch on a threshold beyond 2**20 or below 2**-20,
  and one on two lifted values being equal (the stand-ins are all distinct).
"""

from __future__ import annotations

import math

import torch

from eagerdecomp.decompositions.numerics import to_float32

__all__ = [
    "Lifted",
    "Each",
    "lift_positions",
    "wrapped_positions",
    "split",
    "with_values",
    "stand_ins",
    "same_kernel",
    "LiftRefused",
    "SPECIAL",
]

SPECIAL = frozenset({0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0})
_SCALAR_TYPES = frozenset({"float", "number", "Optional[float]", "Optional[number]"})
# float[] and Scalar[] (and their optional forms) as the schema types print them
_LIST_TYPES = frozenset({"List[float]", "List[number]", "Optional[List[float]]", "Optional[List[number]]"})


class Lifted:
    """Key marker for a lifted float: one singleton per value class."""

    __slots__ = ("negative", "band")

    def __init__(self, negative: bool, band: int):
        self.negative, self.band = negative, band

    def __repr__(self) -> str:
        return f"Lifted({'-' if self.negative else '+'}, {_BAND_NAMES[self.band]})"


# NOTE: csrc/hit.cpp's lift_class draws the same classes; the two must agree.
_BAND_NAMES = ("<0.5", "0.5..1", ">1")
_CLASSES = {(n, b): Lifted(n, b) for n in (False, True) for b in range(3)}
_TINY = 2.0**-20
_MAX_LIFTED = 2**16  # stand-ins stay inside their class and 2**-26 apart (far from rounding)


def _band(a: float) -> int:
    """The band of a magnitude ``a`` (neither 0.5 nor 1: those are special)."""
    return 0 if a < 0.5 else 1 if a < 1 else 2


_ENDS = ((0.0, 0.5), (0.5, 1.0))  # the bands below 1: (low, high)


def _stand_in(band: int, which: int, j: int) -> float:
    """Far end ``which`` of a positive class, nudged per argument ``j`` so all are distinct.

    Nudges run in opposite directions at the two ends, so the order of two lifted
    arguments differs between the traces too.
    """
    nudge = _TINY * (1.0 + j / 64.0)
    if band == 2:
        return 1.0 + nudge if which == 0 else 2.0**20 / (1.0 + j / 64.0)
    low, high = _ENDS[band]
    return low + nudge if which == 0 else high - nudge


class Each:
    """A position in :func:`lift_positions` whose argument is a list: its float elements are
    lifted one by one, each at the position ``(pos, element index)``."""

    __slots__ = ("pos",)

    def __init__(self, pos):
        self.pos = pos

    def __eq__(self, other) -> bool:
        return type(other) is Each and other.pos == self.pos

    def __hash__(self) -> int:
        return hash((Each, self.pos))

    def __repr__(self) -> str:
        return f"Each({self.pos!r})"


def _pointwise(func) -> bool:
    if torch.Tag.pointwise in func.tags:
        return True
    # NOTE: the _foreach_* ops carry no pointwise tag, yet each of their floats (a Scalar, or
    # one element of a Scalar[]) is an operand of the per-tensor op their decomposition calls
    # once per element (eagerdecomp.variants.foreach_table, the same mapping). When that op is
    # tagged pointwise, a float there is lifted for the reason it is for the op itself: it
    # never sizes or selects anything, and the two stand-in traces still have to agree. Ops
    # whose per-tensor op is not pointwise (_foreach_norm's ord) keep their floats by value,
    # and so do the out= forms, for which no per-tensor op is found.
    if not func.__name__.startswith("_foreach_"):
        return False
    from eagerdecomp.ops.variants import per_tensor_op

    found = per_tensor_op(func)
    return found is not None and torch.Tag.pointwise in found[0].tags


def lift_positions(func) -> tuple:
    """Positions of the float arguments of ``func`` worth lifting: an index, or a kwarg
    name, or :class:`Each` of one for a ``float[]``/``Scalar[]`` argument."""
    if not _pointwise(func):
        return ()
    out = []
    for i, a in enumerate(func._schema.arguments):
        t = str(a.type)
        if t in _SCALAR_TYPES:
            out.append(a.name if a.kwarg_only else i)
        elif t in _LIST_TYPES:
            out.append(Each(a.name if a.kwarg_only else i))
    return tuple(out)


def wrapped_positions(func) -> tuple:
    """Positions of the ``Tensor`` arguments of a pointwise ``func``, where a Python float
    can arrive too: eager wraps ``t / 0.3`` as a number tensor, and a boxed device fallback
    receives it back as the float (``div.out(t, 0.3, out=t)`` from AdamW's ``_foreach_div_``).
    :func:`split` lifts only floats, so tensors at these positions are untouched."""
    if torch.Tag.pointwise not in func.tags:
        return ()
    return tuple(a.name if a.kwarg_only else i for i, a in enumerate(func._schema.arguments) if str(a.type) == "Tensor")


def _value_class(v) -> Lifted | None:
    if type(v) is not float:
        return None
    r = to_float32(v)  # a special value rounds to itself, nan and inf too
    if r in SPECIAL or not math.isfinite(r):
        return None
    return _CLASSES[v < 0, _band(abs(v))]


def _split_list(pos, seq, lifted: list):
    """``seq`` with its liftable floats replaced by their class markers (``seq`` itself when none)."""
    if type(seq) is not list and type(seq) is not tuple:
        return seq  # None for an optional list
    out = None
    for i, v in enumerate(seq):
        cls = _value_class(v)
        if cls is not None:
            if out is None:
                out = list(seq)
            out[i] = cls
            lifted.append(((pos, i), v))
    return seq if out is None else type(seq)(out)


def split(positions: tuple, args: tuple, kwargs: dict):
    """Replace liftable floats by their class marker: ``(args, kwargs, lifted)``.

    ``lifted`` is a list of ``(position, value)``, in kernel input order; empty when nothing
    was lifted. The position of a list's element is ``(index or name, element index)``.
    """
    lifted = []
    for pos in positions:
        if type(pos) is Each:
            p = pos.pos
            if type(p) is int:
                if p < len(args):
                    seq = _split_list(p, args[p], lifted)
                    if seq is not args[p]:
                        args = args[:p] + (seq,) + args[p + 1 :]
            elif p in kwargs:
                seq = _split_list(p, kwargs[p], lifted)
                if seq is not kwargs[p]:
                    kwargs = {**kwargs, p: seq}
        elif type(pos) is int:
            if pos < len(args):
                cls = _value_class(args[pos])
                if cls is not None:
                    lifted.append((pos, args[pos]))
                    args = args[:pos] + (cls,) + args[pos + 1 :]
        elif pos in kwargs:
            cls = _value_class(kwargs[pos])
            if cls is not None:
                lifted.append((pos, kwargs[pos]))
                kwargs = {**kwargs, pos: cls}
    return args, kwargs, lifted


def with_values(args: tuple, kwargs: dict, lifted: list, values) -> tuple:
    """``(args, kwargs)`` with each lifted float (list elements too) replaced by its value in ``values``."""
    a, k = list(args), dict(kwargs)
    lists: dict = {}  # position of a list argument -> its copy, written element by element
    for (pos, _), v in zip(lifted, values):
        if type(pos) is tuple:  # an element of a list argument
            pos, i = pos
            holder = a if type(pos) is int else k
            if pos not in lists:
                lists[pos] = (holder, type(holder[pos]), list(holder[pos]))
            lists[pos][2][i] = v
        elif type(pos) is int:
            a[pos] = v
        else:
            k[pos] = v
    for pos, (holder, kind, seq) in lists.items():
        holder[pos] = kind(seq)
    return tuple(a), k


def stand_ins(lifted: list, which: int) -> list:
    """Stand-in values for each lifted scalar in trace ``which`` (0 or 1), all distinct."""
    if len(lifted) > _MAX_LIFTED:
        raise LiftRefused(f"{len(lifted)} lifted floats: more than their stand-ins can keep apart")
    out = []
    for j, (_, v) in enumerate(lifted):
        s = _stand_in(_band(abs(v)), which, j)
        out.append(-s if v < 0 else s)
    return out


class LiftRefused(Exception):
    """Two stand-in values of a lifted float traced different graphs: key by value instead."""


def same_kernel(a, b) -> bool:
    """The two stand-in traces of a lifted call made one kernel: same graph, warnings and constants."""
    consts_a, consts_b = a.constants, b.constants
    return (
        _graph_words(a.graph) == _graph_words(b.graph)
        and a.warnings == b.warnings
        and consts_a.keys() == consts_b.keys()
        and all(consts_a[n].dtype == consts_b[n].dtype and torch.equal(consts_a[n], consts_b[n]) for n in consts_a)
    )


def _graph_words(graph) -> list:
    """Per node its kind, target and arguments, nodes by position and other values by ``repr``:
    equal exactly when FX would generate the same code, without generating it."""
    index = {n: i for i, n in enumerate(graph.nodes)}

    def word(v):
        if isinstance(v, (list, tuple)):
            return type(v).__name__, tuple(word(x) for x in v)
        if isinstance(v, dict):
            return "dict", tuple((k, word(x)) for k, x in v.items())
        return ("node", index[v]) if isinstance(v, torch.fx.Node) else repr(v)

    return [(n.op, repr(n.target), word(n.args), word(n.kwargs)) for n in graph.nodes]
