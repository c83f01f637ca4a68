"""The direct tier: one call's decomposition run on its own tensors, checked as a trace is.

A key that is not hot yet (:mod:`eagerdecomp.runtime.tiers`) takes this path instead of a
trace. The :class:`~eagerdecomp.runtime.lower.Lowerer` walks the same route as when
tracing, so the same opset ops run, in the same order, drawing the same random numbers;
and :func:`~eagerdecomp.runtime.exact.finish_outputs` checks and fixes the outputs against
eager's meta kernel and aliasing rules exactly as it does for a traced kernel, its
fix-ups run on the real tensors instead of being recorded.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from eagerdecomp.ops.attribution import warn_as_eager
from eagerdecomp.runtime.exact import check_devices, eager_reference, finish_outputs, flat_tensors
from eagerdecomp.runtime.lower import Lowerer, Stuck
from eagerdecomp.runtime.quiet import issue_once, quiet

__all__ = ["run_direct", "tiered", "Unfinished"]

_SEEDED = torch.Tag.nondeterministic_seeded


class Unfinished(Exception):
    """A direct run met an op with no path after it had written memory or drawn random
    numbers: the call cannot be handed to another route without doing part of it twice."""

    def __init__(self, stuck: Stuck):
        super().__init__(str(stuck))
        self.stuck = stuck


class _Emit:
    """The Lowerer's ``emit`` on the direct tier: run the opset op, noting which ran and
    whether one wrote memory or drew random numbers."""

    __slots__ = ("ops", "effects")

    def __init__(self):
        self.ops: set = set()
        self.effects = False

    def __call__(self, func, args, kwargs):
        if func not in self.ops:
            self.ops.add(func)
            self.effects = self.effects or func._schema.is_mutable or _SEEDED in func.tags
        return func(*args, **kwargs)


@functools.cache
def tiered(func) -> bool:
    """Whether calls of ``func`` may run direct.

    NOTE: not an out= op: eager resizes its outputs by rules some meta kernels do not follow
    (``histogram.bin_ct_out``'s leaves them empty), which a trace meets over fake tensors before
    anything is written and answers by decomposing eagerly; a direct run would meet the
    disagreement only after writing. Training loops rarely call out= forms; they trace at once.
    """
    return not any(a.is_out for a in func._schema.arguments)


class _RealFixups:
    """:func:`finish_outputs`' emitter on the direct tier: values are the tensors themselves,
    and a fix-up (clone, restride) runs now, lowered into the opset like the decomposition."""

    fake_mode = contextlib.nullcontext()

    def __init__(self, lowerer: Lowerer):
        self._lowerer = lowerer

    def node(self, x):
        return x

    def value(self, x):
        return x

    def __call__(self, func, args, kwargs):
        if func in self._lowerer.opset:
            return self._lowerer.emit(func, args, kwargs)
        return self._lowerer.lower(func, args, kwargs)


def run_direct(func, args, kwargs, opset, table, tensors=None, known=None):
    """``(func(*args, **kwargs), the opset ops that ran, eager's metadata)``: the call decomposed
    into ``opset`` on its own tensors, eager-exact; ``tensors``: the call's tensors in key order
    (:func:`~eagerdecomp.runtime.key.make_key`); ``known``: the metadata an earlier direct call
    of the same key returned (it depends on nothing else the key does not hold).

    Raises :class:`Stuck` when the op has no path and nothing was written or drawn yet (the
    caller may trace it and take the no-path route), :class:`Unfinished` when something was.
    """
    check_devices(func, flat_tensors(args, kwargs) if tensors is None else tensors, args, kwargs)
    ref, refusal = eager_reference(func, args, kwargs, tensors, known)
    if refusal is not None and func._schema.is_mutable:  # refused before anything is written
        raise refusal.error
    emit = _Emit()
    lowerer = Lowerer(opset, table, emit)
    try:
        # NOTE: as a trace does, only eager's own warnings come out of a decomposition, raised
        # after it at the line that called the op, as eager raises a kernel's
        with quiet() as caught:
            out = lowerer.lower(func, args, kwargs)
            flat, spec = tree_flatten(out)
            flat = finish_outputs(func, _RealFixups(lowerer), args, kwargs, flat, ref, [])
    except Stuck as e:
        if refusal is not None:  # declined arguments eager refuses: eager's error, not "no path"
            raise refusal.error from None
        if emit.effects:
            raise Unfinished(e) from None
        raise
    for text in issue_once(caught):
        warn_as_eager(text)
    if refusal is not None:  # the decomposition computed something where eager refuses
        raise refusal.error
    return tree_unflatten(flat, spec), emit.ops, ref
