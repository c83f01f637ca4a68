"""The runtime: one call's route from key to replay (:mod:`~eagerdecomp.runtime.core`), and
the stages it goes through: key, lift, cache, family, trace, lower, exact, replay, the C++ hit
path (:mod:`~eagerdecomp.runtime.hits`), per-op compiled kernels
(:mod:`~eagerdecomp.runtime.compiler`), the disk cache, stats. docs/internals.md draws it."""

from eagerdecomp.runtime.core import ON_UNSUPPORTED, Runtime, runtime_for

__all__ = ["Runtime", "runtime_for", "ON_UNSUPPORTED"]
