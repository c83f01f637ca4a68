"""Tiers: a new key runs its decomposition directly until it proves hot, then is traced.

Tracing a key's kernel costs milliseconds (fake tensors, an FX graph, its code generated);
running the decomposition once on the call's own tensors costs about what its ops cost.
Most keys of a short process (a test, a notebook cell, the first step of a job) are met
once or twice, so the first :data:`TRACE_AFTER` calls of a key run *direct* (with the
same checks against eager's meta kernel and aliasing rules a trace applies), and the
next one traces. A key's shape family (:mod:`eagerdecomp.runtime.family`) counts its
distinct keys: shapes that change every call make the family hot although no key repeats.

A kernel another process left (the disk cache, a bundle) or a family member this
process holds answers at once, whatever the count.

``EAGERDECOMP_TRACE_AFTER=N`` sets how many calls run direct (default 2; 0 traces every
key at its first call, as before tiers existed).
"""

from __future__ import annotations

import os
import threading

__all__ = ["Tiers", "trace_after"]

# NOTE: a bound on the keys counted: a long run with shapes that change every call would
# otherwise grow the table for its whole life (counts restart after a clear: only speed)
_MAX_COUNTED = 1 << 16


# NOTE: a shape family is hot once this many times TRACE_AFTER distinct keys of it ran direct:
# an optimizer's parameters are a dozen keys of one family met once per step each, which
# the first step should not pay a shape-generic trace for (the slowest kind); shapes that
# change every step (dynamic padding) reach it within a few steps
FAMILY_KEYS = 8

# NOTE: a shape-generic trace costs ten to twenty exact ones (BERT's AdamW updates: 30-75 ms
# against ~4 ms), so a family pays exact traces for its hot keys until they add up to about one
# shape-generic trace, then takes that (rent until renting has cost the price of buying). An
# optimizer's parameters are a fixed handful of shapes per family: they keep exact kernels
# (counting shapes met instead, BERT's second step paid ~190 ms of symbolic traces for them);
# shapes that change every step (dynamic padding, a growing KV cache) reach it within steps.
FAMILY_TRACES = 8


def trace_after() -> int:
    """The calls of a key (or its shape family) that run direct before it is traced."""
    value = os.environ.get("EAGERDECOMP_TRACE_AFTER", "2")
    try:
        n = int(value)
    except ValueError:
        from eagerdecomp.errors import UnsupportedArgumentError

        raise UnsupportedArgumentError(
            f"EAGERDECOMP_TRACE_AFTER must be a whole number of calls (0 traces at the first call), got {value!r}"
        ) from None
    return max(n, 0)


class Tiers:
    """Counts a cache's direct calls per key and per shape family; shared by its runtimes."""

    def __init__(self):
        self._seen: dict = {}
        self._refs: dict = {}  # key -> eager's metadata for it (exact.reference), while it is cold
        self._traced: dict = {}  # family -> exact traces made for its keys
        self._lock = threading.Lock()

    def cold(self, key, fkey=None) -> bool:
        """Whether this call of ``key`` (of family ``fkey``, or None) runs direct; counts it."""
        after = trace_after()  # (read per cold call: an environment lookup beside a decomposition)
        if after <= 0:
            return False
        with self._lock:
            seen = self._seen
            n, f = seen.get(key, 0), seen.get(fkey, 0) if fkey is not None else 0
            if n >= after or f >= after * FAMILY_KEYS:
                self._refs.pop(key, None)  # (traced now: the trace takes its own)
                return False
            if len(seen) >= _MAX_COUNTED:
                seen.clear()
                self._refs.clear()
                self._traced.clear()
            seen[key] = n + 1
            if fkey is not None and n == 0:  # (a family counts its distinct keys)
                seen[fkey] = f + 1
            return True

    def varies(self, fkey) -> bool:
        """Whether family ``fkey``'s next trace should be shape-generic: it has paid
        :data:`FAMILY_TRACES` exact ones, or met so many distinct keys that the family itself is
        hot (always, with tiers off: every key is then traced at its first call, shape-generic
        where it can be, as before tiers)."""
        if fkey is None:
            return False
        after = trace_after()
        if after <= 0:
            return True
        return self._traced.get(fkey, 0) >= FAMILY_TRACES or self._seen.get(fkey, 0) >= after * FAMILY_KEYS

    def traced(self, fkey) -> None:
        """Count an exact trace made for a key of family ``fkey``."""
        if fkey is not None:
            with self._lock:
                self._traced[fkey] = self._traced.get(fkey, 0) + 1

    def known(self, key):
        """Eager's metadata for ``key`` that an earlier direct call kept, or None."""
        return self._refs.get(key)

    def keep(self, key, ref) -> None:
        """Keep ``ref`` (eager's metadata for ``key``; None: the op has no meta kernel) for the
        key's next direct calls: the meta kernel, over fake tensors, costs more than most
        decompositions' own ops."""
        if ref is not None:
            ref = ref.frozen()  # (read by any thread: apart from the fake mode that made it)
            with self._lock:
                self._refs[key] = ref

    def heat(self, key) -> None:
        """Make ``key`` hot now: its next call traces (a direct run found no path)."""
        with self._lock:
            self._seen[key] = 1 << 30

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._refs.clear()
            self._traced.clear()
