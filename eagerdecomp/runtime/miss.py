"""A miss: one call of a decomposed op that the C++ hit path could not serve, as one object.

The Python path (:meth:`~eagerdecomp.runtime.core.Runtime._decompose`) keys the call once and
carries this object through the routes a miss can take (direct, trace, a shape family's
kernel, the disk), instead of the call and its key's parts side by side. What answered the
miss (:class:`Answer`) is returned with the cache entry, never kept beside the call.
"""

from __future__ import annotations

import enum

from eagerdecomp.runtime.family import read_ints

__all__ = ["Miss", "Answer"]


class Answer(enum.Enum):
    """How a miss was answered, beside the entry :meth:`KernelCache.get_or_make` returns."""

    TRACED = "traced"  # a trace made the entry now (or the entry is a refusal: data)
    FAMILY = "shape family"  # a shape-generic member this process holds admits the key: no trace
    DISK = "loaded from disk"  # the persistent cache or a bundle held the key's kernel
    COLD = "cold"  # the key is not hot yet: run the call direct, store nothing (runtime/tiers.py)


class Miss:
    """One call and its key: ``key`` and ``tensors`` from :func:`~eagerdecomp.runtime.key.make_key`
    over ``keyed`` (the arguments with their lifted floats taken out; ``lifted``: ``(position,
    value)`` pairs, kernel inputs); ``fkey``: its shape family's key once asked (None: exact
    shapes only); ``member``: the family member that answered it, if one did."""

    __slots__ = ("func", "args", "kwargs", "keyed", "key", "tensors", "lifted", "fkey", "member")

    def __init__(self, func, args, kwargs, keyed, key, tensors, lifted):
        self.func, self.args, self.kwargs, self.keyed = func, args, kwargs, keyed
        self.key, self.tensors, self.lifted = key, tensors, lifted
        self.fkey = self.member = None

    def inputs(self, kernel) -> list:
        """The kernel's inputs for this call: tensors, lifted floats, a shape-generic kernel's ints."""
        inputs = self.tensors + [v for _, v in self.lifted] if self.lifted else self.tensors
        if kernel.ints:
            inputs = inputs + read_ints(kernel.ints, self.args, self.kwargs)
        return inputs
