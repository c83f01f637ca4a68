"""A bounded, thread-safe LRU of traced kernels, shared per (opset, table).

Entries are :class:`~eagerdecomp.replay.Kernel` objects or negative entries
(:class:`Negative`) that remember why a key cannot be replayed, so a bypass
or an unsupported op is decided once per key, not once per call.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import cachetools

__all__ = ["KernelCache", "Negative", "CacheInfo", "cache_for", "cache_info", "cache_clear"]

DEFAULT_MAXSIZE = int(os.environ.get("EAGERDECOMP_CACHE_SIZE", "4096"))


@dataclass(frozen=True)
class Negative:
    """A remembered refusal: ``kind`` is "bypass" or "unsupported"."""

    kind: str
    reason: str
    error: Exception | None = None


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int
    negative: int


class KernelCache:
    def __init__(self, maxsize: int = DEFAULT_MAXSIZE):
        self._lru = cachetools.LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key):
        with self._lock:
            try:
                entry = self._lru[key]  # one lookup, and marks the key most recently used
            except KeyError:
                self.misses += 1
                return None
            self.hits += 1
            return entry

    def put(self, key, entry) -> None:
        with self._lock:
            self._lru[key] = entry

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self.hits = self.misses = 0

    def info(self) -> CacheInfo:
        with self._lock:
            negative = sum(isinstance(v, Negative) for v in self._lru.values())
            return CacheInfo(self.hits, self.misses, len(self._lru), self._lru.maxsize, negative)

    def __len__(self) -> int:
        return len(self._lru)


_CACHES: dict = {}
_CACHES_LOCK = threading.Lock()


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
