"""Silence what tracing raises, in the tracing thread only.

Tracing runs an op's meta kernel and its decomposition on fake tensors; what
they warn or log is an artifact of tracing (the real call warns for itself),
except the warning eager raises on every call that resizes a non-empty out=
tensor, which a kernel records and replays.

``warnings.catch_warnings`` and ``logger.disabled`` cannot do this: they swap
process-wide state, so two threads tracing at once restore each other's
state, leaving every later warning of the process swallowed into a dead list
and the fake-tensor logger off. Here a warnings filter and a logging filter
are installed once and act only while the *current thread* is inside
:func:`quiet`; other threads' warnings and logs are untouched.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings

from eagerdecomp.ops.attribution import warn_as_eager
from eagerdecomp.ops.checks import ONCE, ONCE_MESSAGES, warn_once

__all__ = ["quiet", "forward", "RESIZE_MESSAGE", "once", "issue_once", "replay_once"]

# NOTE: the text of eager's out= resize warning (ATen's resize_output, torch's out_wrapper and
# ours all contain it), of its deprecation of writing expanded tensors (overlap.py) and of its
# nondeterminism alert under warn_only (checks.py): the warnings raised while tracing that a
# kernel replays, as eager raises them on every call.
RESIZE_MESSAGE = "was resized since it had shape"
_REPLAYED = (RESIZE_MESSAGE, "on expanded tensors is deprecated", "does not have a deterministic implementation")
# NOTE: warnings eager raises once per process (TORCH_WARN_ONCE; eagerdecomp.ops.checks.ONCE fires
# them with eager's own flag): raised for the call that fired one, never recorded in a kernel; a
# call a kernel serves asks eager's flag again (replay_once).
_ONCE = ONCE_MESSAGES

_tls = threading.local()
_lock = threading.Lock()


class _WhileTracing:
    """A warnings-filter message pattern: matches only in a thread inside :func:`quiet`,
    and records what it matched there."""

    def match(self, text: str) -> bool:
        caught = getattr(_tls, "caught", None)
        if caught is None:
            return False
        if any(m in text for m in _REPLAYED) or once(text):
            caught.append(text)
        return True


class _LogWhileTracing(logging.Filter):
    def filter(self, record) -> bool:
        return getattr(_tls, "caught", None) is None


_PATTERN = _WhileTracing()
_FILTER = ("ignore", _PATTERN, Warning, None, 0)
_LOG_FILTER = _LogWhileTracing()
# FakeTensorMode logs every failing meta kernel with a traceback at ERROR level; a call
# eager rejects fails on fakes first, and the real call then raises the user's error.
_LOGGERS = ("torch._subclasses.fake_tensor",)


def _install() -> None:
    # NOTE: checked on each trace, not once: warnings.resetwarnings() drops the filter, and
    # a filter added later (pytest.warns' "always") goes in front of it. It must come first
    # to act; in threads that are not tracing it matches nothing, so its place is harmless.
    filters = warnings.filters
    if filters and filters[0] is _FILTER:
        return
    with _lock:
        filters = warnings.filters
        if not (filters and filters[0] is _FILTER):
            if _FILTER in filters:
                filters.remove(_FILTER)
            filters.insert(0, _FILTER)
            warnings._filters_mutated()  # the C registry caches filter results by version
        for name in _LOGGERS:
            log = logging.getLogger(name)
            if _LOG_FILTER not in log.filters:
                log.addFilter(_LOG_FILTER)


@contextlib.contextmanager
def quiet():
    """Silence warnings and tracing logs in this thread; yields the list of the texts of eager's
    warnings raised meanwhile (in order): those eager raises on every call, and the :func:`once`
    ones. Nests: an inner block records into its own list."""
    _install()
    outer = getattr(_tls, "caught", None)
    caught: list = []
    _tls.caught = caught
    try:
        yield caught
    finally:
        _tls.caught = outer


def forward(caught) -> None:
    """Record ``caught`` (an inner :func:`quiet` block's texts) in this thread's enclosing block."""
    outer = getattr(_tls, "caught", None)
    if outer is not None:
        outer.extend(caught)


def once(text: str) -> bool:
    """Whether ``text`` is a warning eager raises once per process (see ``_ONCE``)."""
    return any(m in text for m in _ONCE)


def issue_once(caught) -> list:
    """Raise the :func:`once` warnings among ``caught`` (a :func:`quiet` list) for this call, as
    eager does; return the others (raised on every call, so a kernel replays them)."""
    kept = []
    for text in caught:
        if once(text):
            warn_as_eager(text)
        else:
            kept.append(text)
    return kept


def replay_once(func, args, kwargs) -> None:
    """Eager's once-per-process warning for a call served without lowering (a replay, a kernel
    from the disk cache or a shape family): eager's own flag decides, so the process's first such
    call warns, native or not, and every call does under ``torch.set_warn_always(True)``.

    NOTE: a kernel cannot record it (it fires once per process, not per call) and the lowering
    that fires it runs only when a call is traced or decomposed eagerly, so a replayed call asks
    the flag here, for the op called (as lowering does); ``runtime/program.py`` keeps these ops off
    the C++ hit path, which would not ask."""
    if func in ONCE:
        with quiet() as caught:
            warn_once(func, args, kwargs)
        issue_once(caught)
