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
from dataclasses import dataclass
from typing import Callable

import cachetools

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


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int
    negative: int


class _Flight:
    """A trace in progress: the thread doing it, and an event the others wait on."""

    __slots__ = ("owner", "done")

    def __init__(self):
        self.owner = threading.get_ident()
        self.done = threading.Event()


class KernelCache:
    def __init__(self, maxsize: int = DEFAULT_MAXSIZE):
        self._lru = cachetools.LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()
        self._flights: dict = {}  # key -> _Flight
        self.hits = 0
        self.misses = 0
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
        """``(entry, made)``: the entry for ``key``, calling ``make(*args)`` to build it on a miss.

        One thread makes a key at a time; the others wait for it. ``make`` runs without
        the lock held; if it raises, nothing is stored and the error propagates.
        """
        while True:
            with self._lock:
                entry = self._lru.get(key)
                if entry is not None:
                    self.hits += 1
                    return entry, False
                flight = self._flights.get(key)
                mine = flight is None
                if mine:
                    self.misses += 1
                    flight = self._flights[key] = _Flight()
            if mine:
                try:
                    entry = make(*args)
                    with self._lock:
                        self._lru[key] = entry
                    return entry, True
                finally:
                    with self._lock:
                        self._flights.pop(key, None)
                    flight.done.set()
            if flight.owner == threading.get_ident():
                # NOTE: the same thread re-entering a key it is tracing would wait for itself
                # forever; make it again, uncached (the outer trace stores its own).
                return make(*args), True
            flight.done.wait()  # then look again: the entry is there, or that trace failed

    def put(self, key, entry) -> None:
        with self._lock:
            self._lru[key] = entry

    def discard(self, key) -> None:
        with self._lock:
            self._lru.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self.hits = self.misses = 0

    def info(self) -> CacheInfo:
        with self._lock:
            negative = sum(isinstance(v, NEGATIVE) for v in self._lru.values())
            return CacheInfo(self.hits, self.misses, len(self._lru), self._lru.maxsize, negative)

    def __len__(self) -> int:
        return len(self._lru)


_CACHES: dict = {}
_CACHES_LOCK = threading.Lock()
_LIVE: "weakref.WeakSet[KernelCache]" = weakref.WeakSet()


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
    )


def cache_clear() -> None:
    """Drop every cached kernel and negative entry, and reset the counters."""
    with _CACHES_LOCK:
        for c in _CACHES.values():
            c.clear()


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
    _FORK_HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
