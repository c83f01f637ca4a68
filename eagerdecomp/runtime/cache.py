"""A bounded, thread-safe LRU of traced kernels, shared per (opset, table).

An entry is data: a :class:`~eagerdecomp.replay.Kernel`, or a frozen record of
why a key cannot be replayed (:class:`Unsupported`, :class:`Bypassed`,
:class:`ByValue`), so a refusal is decided once per key, not once per call.
Entries never hold an exception: its traceback would pin the first call's
frames, and their tensors, for as long as the entry lives; the error is built
when it is raised.

Concurrency. Lookups and inserts take the cache's lock (held for a dict
operation, never while tracing), so nothing relies on the GIL. A key is traced
by one thread at a time: others that miss it meanwhile wait for that trace
and then replay its entry (:meth:`KernelCache.get_or_make`). A trace that
raises, or is interrupted, leaves no entry, and the next caller traces again.
After ``fork`` the child gets fresh locks and no trace in flight.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import cachetools

from eagerdecomp.runtime.miss import Answer
from eagerdecomp.runtime.tiers import Tiers
from eagerdecomp.runtime.trace import traced

__all__ = [
    "KernelCache",
    "Unsupported",
    "Bypassed",
    "ByValue",
    "CacheInfo",
    "cache_for",
    "cache_info",
    "cache_clear",
]

DEFAULT_MAXSIZE = int(os.environ.get("EAGERDECOMP_CACHE_SIZE", "4096"))


@dataclass(frozen=True)
class Unsupported:
    """No path to the opset: ``chain`` is where lowering got stuck, outermost first."""

    chain: tuple
    reason: str


@dataclass(frozen=True)
class Bypassed:
    """Cannot be replayed (data-dependent, no fake kernel...): decompose on the real tensors."""

    reason: str


@dataclass(frozen=True)
class ByValue:
    """The call's lifted floats change the graph: key this op's floats by value."""

    reason: str


NEGATIVE = (Unsupported, Bypassed, ByValue)


# EagerDecompMode entries per path, process-wide (eagerdecomp.runtime.keymode counts them)
MODE_ENTRIES = {"C++ key": 0, "Python": 0}


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int
    negative: int
    families: int = 0  # shape families (eagerdecomp.family) with at least one generic kernel
    members: int = 0  # shape-generic kernels, over all families
    family_hits: int = 0  # exact-key misses answered by a shape-generic kernel
    preloaded: int = 0  # C++ programs installed from disk before a first miss (eagerdecomp.runtime.hits)
    traced: int = 0  # kernels traced in this process, exact and shape-generic (never reset)
    cxx_mode: int = 0  # EagerDecompMode entries on its C++ key (eagerdecomp.runtime.keymode; never reset)
    python_mode: int = 0  # EagerDecompMode entries on its Python path (never reset)


class _Flight:
    """A trace in progress: the thread doing it, and an event the others wait on."""

    __slots__ = ("owner", "done")

    def __init__(self):
        self.owner = threading.get_ident()
        self.done = threading.Event()


_COLD = Answer.COLD


class KernelCache:
    def __init__(self, maxsize: int = DEFAULT_MAXSIZE):
        self._lru = cachetools.LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()
        self._flights: dict = {}  # key -> _Flight
        # shape families (eagerdecomp.family): family key -> Family, and the member traces in flight
        self._families = cachetools.LRUCache(maxsize=maxsize)
        self._family_flights: dict = {}
        self.hits = 0
        self.misses = 0
        self.family_hits = 0
        self.programs_read = False  # eagerdecomp.runtime.hits.preload: the disk's programs installed
        self.programs_preloaded = 0
        self.tiers = Tiers()  # which keys still run direct (eagerdecomp.runtime.tiers)
        _LIVE.add(self)

    def get(self, key):
        """The entry for ``key`` (marked most recently used), or None."""
        with self._lock:
            entry = self._lru.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
            return entry

    def get_or_make(self, key, make: Callable, *args) -> tuple:
        """``(entry, answer)``: the entry for ``key`` and None on a hit; on a miss, what
        ``make(*args)`` returned, ``(entry, answer)`` (:class:`~eagerdecomp.runtime.miss.Answer`),
        stored unless the answer is ``COLD`` (nothing made: the key's next call asks again).

        One thread makes a key at a time; the others wait for it. ``make`` runs without
        the lock held; if it raises, nothing is stored and the error propagates.
        """
        while True:
            with self._lock:
                entry = self._lru.get(key)
                if entry is not None:
                    self.hits += 1
                    return entry, None
                flight = self._flights.get(key)
                mine = flight is None
                if mine:
                    self.misses += 1
                    flight = self._flights[key] = _Flight()
            if mine:
                try:
                    entry, answer = made = make(*args)
                    if answer is not _COLD:
                        with self._lock:
                            self._lru[key] = entry
                    return made
                finally:
                    with self._lock:
                        self._flights.pop(key, None)
                    flight.done.set()
            if flight.owner == threading.get_ident():
                # NOTE: the same thread re-entering a key it is tracing would wait for itself
                # forever; make it again, uncached (the outer trace stores its own).
                return make(*args)
            flight.done.wait()  # then look again: the entry is there, or that trace failed

    def family(self, fkey):
        """The :class:`~eagerdecomp.family.Family` of ``fkey``, or None."""
        with self._lock:
            return self._families.get(fkey)

    def adopt_family(self, fkey, family) -> None:
        """Set ``fkey``'s family unless one is there already (members loaded from disk)."""
        with self._lock:
            if self._families.get(fkey) is None:
                self._families[fkey] = family

    def set_family(self, fkey, family) -> None:
        with self._lock:
            self._families[fkey] = family

    def find_or_make_member(self, fkey, find: Callable, make: Callable, max_members: int):
        """A kernel of family ``fkey`` for one call: ``(kernel or None, made)``.

        ``find(members)`` returns an admitting member's kernel or None (guards run without
        the lock); on no admitting member, ``make()`` traces one more member (one thread per
        family at a time; the others wait, then look again) and it is added. ``make`` raising
        :class:`~eagerdecomp.symbolic.NotGeneric` marks the family exact-only (``(None, False)``);
        any other error propagates and leaves the family as it was.
        """
        from eagerdecomp.runtime.family import Family
        from eagerdecomp.runtime.symbolic import NotGeneric

        while True:
            with self._lock:
                family = self._families.get(fkey)
            if family is not None and family.exact:
                return None, False
            members = family.members if family is not None else ()
            try:
                kernel = find(members)
            except NotGeneric as e:
                self._mark_exact(fkey, e.reason)
                return None, False
            if kernel is not None:
                with self._lock:
                    self.family_hits += 1
                return kernel, False
            with self._lock:
                now = self._families.get(fkey)
                if (now.members if now is not None else ()) is not members or (now is not None and now.exact):
                    continue  # it changed while the guards ran: look again
                flight = self._family_flights.get(fkey)
                mine = flight is None
                if mine:
                    flight = self._family_flights[fkey] = _Flight()
            if not mine:
                if flight.owner == threading.get_ident():
                    return None, False  # NOTE: re-entered while tracing this family: exact kernel
                flight.done.wait()
                continue
            try:
                try:
                    member = make()
                except NotGeneric as e:
                    self._mark_exact(fkey, e.reason)
                    return None, False
                with self._lock:
                    now = self._families.get(fkey) or Family()
                    if now.exact is None:
                        if len(now.members) >= max_members:
                            self._families[fkey] = Family(now.members, f"more than {max_members} shape specializations")
                        else:
                            self._families[fkey] = Family(now.members + (member,))
                return member.kernel, True
            finally:
                with self._lock:
                    self._family_flights.pop(fkey, None)
                flight.done.set()

    def _mark_exact(self, fkey, reason: str) -> None:
        from eagerdecomp.runtime.family import Family

        with self._lock:
            self._families[fkey] = Family((), reason)

    def put(self, key, entry) -> None:
        with self._lock:
            self._lru[key] = entry

    def kernels_of(self, op, limit: int = 4) -> list:
        """Up to ``limit`` cached kernels of ``op`` (what it runs, for a report)."""
        with self._lock:
            out = [v for v in self._lru.values() if getattr(v, "op", None) is op]
        return out[:limit]

    def discard(self, key) -> None:
        with self._lock:
            self._lru.pop(key, None)

    def clear(self) -> None:
        from eagerdecomp.runtime.hits import clear_for

        with self._lock:
            self._lru.clear()
            self._families.clear()
            self.hits = self.misses = self.family_hits = 0
        self.tiers.clear()
        clear_for(self)  # the C++ tables in front of it: a cache of this cache

    def info(self) -> CacheInfo:
        from eagerdecomp.runtime.hits import hits_for

        served = hits_for(self)  # hits served by the C++ tables in front of this cache
        with self._lock:
            negative = sum(isinstance(v, NEGATIVE) for v in self._lru.values())
            members = [len(f.members) for f in self._families.values()]
            return CacheInfo(
                self.hits + served,
                self.misses,
                len(self._lru),
                self._lru.maxsize,
                negative,
                sum(1 for m in members if m),
                sum(members),
                self.family_hits,
                self.programs_preloaded,
            )

    def __len__(self) -> int:
        return len(self._lru)


_CACHES: dict = {}
_CACHES_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[KernelCache] = weakref.WeakSet()


def cache_for(key) -> KernelCache:
    """The process-wide cache for ``key`` (an opset and table fingerprint)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = KernelCache()
        return cache


def cache_info() -> CacheInfo:
    """Totals over every process-wide kernel cache."""
    with _CACHES_LOCK:
        infos = [c.info() for c in _CACHES.values()]
    return CacheInfo(
        hits=sum(i.hits for i in infos),
        misses=sum(i.misses for i in infos),
        size=sum(i.size for i in infos),
        maxsize=sum(i.maxsize for i in infos),
        negative=sum(i.negative for i in infos),
        families=sum(i.families for i in infos),
        members=sum(i.members for i in infos),
        family_hits=sum(i.family_hits for i in infos),
        preloaded=sum(i.preloaded for i in infos),
        traced=traced(),
        cxx_mode=MODE_ENTRIES["C++ key"],
        python_mode=MODE_ENTRIES["Python"],
    )


def cache_clear(disk: bool = False) -> None:
    """Drop every cached kernel and negative entry, and reset the counters.

    ``disk=True`` also removes every kernel written to the persistent cache (eagerdecomp.disk).
    """
    with _CACHES_LOCK:
        for c in _CACHES.values():
            c.clear()
    from eagerdecomp.runtime.compiler import clear as clear_compiled

    clear_compiled()
    if disk:
        from eagerdecomp.runtime.disk import clear

        clear()


# NOTE: fork copies memory, not threads. Every cache lock is taken around fork, so the child
# never sees an LRU half-updated; the child then gets fresh locks and no flights (a trace
# another thread had in flight never finishes there; the child traces the key itself).
_FORK_HELD: list = []


def _before_fork() -> None:
    _CACHES_LOCK.acquire()
    _FORK_HELD[:] = list(_LIVE)
    for cache in _FORK_HELD:
        cache._lock.acquire()


def _after_fork_in_parent() -> None:
    for cache in _FORK_HELD:
        cache._lock.release()
    _FORK_HELD.clear()
    _CACHES_LOCK.release()


def _after_fork_in_child() -> None:
    global _CACHES_LOCK
    _CACHES_LOCK = threading.Lock()
    for cache in _FORK_HELD:
        cache._lock = threading.Lock()
        cache._flights = {}
        cache._family_flights = {}
    _FORK_HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
