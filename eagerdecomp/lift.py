"""Scalar lifting: one kernel for every ordinary value of a float operand.

Keys hold scalars by value, so an op called with ever-changing floats (AdamW's
``addcdiv_(..., value=-step_size)``, a learning-rate schedule) would trace a
kernel per value. For pointwise ops, a float argument is instead *lifted*: the
key holds only its value class, and the kernel takes the value as an input.

Lifting must never change a result, so it is earned, not assumed:

* only ops tagged ``pointwise`` are tried, and only their ``float``/``number``
  arguments that arrive as Python floats;
* special values (0, +-1, +-0.5, +-2, nan, +-inf) are never lifted: decompositions
  branch on them, so they keep a kernel of their own, keyed by value;
* a value class is (sign, magnitude above 1), so range checks such as
  ``0 <= p <= 1`` see a representative value;
* the kernel is traced twice, with stand-ins at the two far ends of the class
  (2**-20 and 1 - 2**-20; 1 + 2**-20 and 2**20); the two graphs (code and
  constants) must be identical once the stand-ins are inputs. A Python branch on
  any threshold inside the class, or a value computed with into a baked
  constant, makes them differ, and the op falls back to keys by value for good.
  What remains unchecked is a branch on a threshold beyond 2**20 or below 2**-20.
"""

from __future__ import annotations

import math

import torch

__all__ = ["Lifted", "lift_positions", "wrapped_positions", "split", "stand_ins", "same_kernel", "LiftRefused", "SPECIAL"]

SPECIAL = frozenset({0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0})
_SCALAR_TYPES = frozenset({"float", "number", "Optional[float]", "Optional[number]"})


class Lifted:
    """Key marker for a lifted float: one singleton per value class."""

    __slots__ = ("negative", "large")

    def __init__(self, negative: bool, large: bool):
        self.negative, self.large = negative, large

    def __repr__(self) -> str:
        return f"Lifted({'-' if self.negative else '+'}, {'>1' if self.large else '<1'})"


_CLASSES = {(n, l): Lifted(n, l) for n in (False, True) for l in (False, True)}
_TINY = 2.0**-20


def _stand_in(large: bool, which: int, j: int) -> float:
    """Far end ``which`` of a positive class, nudged per argument ``j`` so all are distinct.

    Nudges run in opposite directions at the two ends, so the order of two lifted
    arguments differs between the traces too.
    """
    nudge = _TINY * (1.0 + j / 64.0)
    if large:
        return 1.0 + nudge if which == 0 else 2.0**20 / (1.0 + j / 64.0)
    return nudge if which == 0 else 1.0 - nudge


def lift_positions(func) -> tuple:
    """Positions (index, or kwarg name) of the float arguments of ``func`` worth lifting."""
    if torch.Tag.pointwise not in func.tags:
        return ()
    out = []
    for i, a in enumerate(func._schema.arguments):
        if str(a.type) in _SCALAR_TYPES:
            out.append(a.name if a.kwarg_only else i)
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
    if type(v) is not float or v in SPECIAL or not math.isfinite(v):
        return None
    return _CLASSES[v < 0, abs(v) > 1]


def split(positions: tuple, args: tuple, kwargs: dict):
    """Replace liftable floats by their class marker: ``(args, kwargs, lifted)``.

    ``lifted`` is a list of ``(position, value)``; empty when nothing was lifted.
    """
    lifted = []
    for pos in positions:
        if type(pos) is int:
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


def stand_ins(lifted: list, which: int) -> list:
    """Stand-in values for each lifted scalar in trace ``which`` (0 or 1), all distinct."""
    out = []
    for j, (_, v) in enumerate(lifted):
        s = _stand_in(abs(v) > 1, which, j)
        out.append(-s if v < 0 else s)
    return out


class LiftRefused(Exception):
    """Two stand-in values of a lifted float traced different graphs: key by value instead."""


def same_kernel(a, b) -> bool:
    """The two stand-in traces of a lifted call made one kernel: same code, warnings and constants."""
    consts_a, consts_b = a.module._constants, b.module._constants
    return (
        a.module.code == b.module.code
        and a.warnings == b.warnings
        and consts_a.keys() == consts_b.keys()
        and all(consts_a[n].dtype == consts_b[n].dtype and torch.equal(consts_a[n], consts_b[n]) for n in consts_a)
    )
