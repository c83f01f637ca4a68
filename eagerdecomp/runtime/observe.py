"""Where eagerdecomp shows what it does: a ``logging`` logger and ``torch.profiler`` ranges.

* The logger is named ``eagerdecomp``. It is quiet by default (Python's logging shows
  nothing below WARNING); ``EAGERDECOMP_LOG=info`` prints each trace, bypass and refusal
  as it is decided (once per cache key, never per replayed call), ``EAGERDECOMP_LOG=debug``
  adds each traced kernel's code. Applications can also configure it like any logger.
* Under ``torch.profiler``, each decomposed call shows as a range named
  ``eagerdecomp.<route> <op>`` (``trace``, ``replay`` or ``eager``), around the core ops it
  ran, so a profile says where eagerdecomp's time goes; a call the CPU tier decides in Python
  shows as ``eagerdecomp.cpu_fallback <op>``, around its copies and the CPU kernel (an op with
  no decomposition is not traced first, so no ``trace`` range precedes it). When no profiler runs, the check is
  one read of a module attribute that the profiler sets (``bench/micro.py`` measures it).

Example::

    >>> import torch, eagerdecomp as ed
    >>> with torch.profiler.profile() as prof, ed.EagerDecompMode("core_aten"):
    ...     _ = torch.nn.functional.silu(torch.randn(8))
    >>> any(e.name.startswith("eagerdecomp.") for e in prof.events())
    True
"""

from __future__ import annotations

import logging
import os

import torch.autograd.profiler as _profiler
from torch._C._profiler import _RecordFunctionFast

__all__ = ["log", "profiling", "ranged"]

log = logging.getLogger("eagerdecomp")


def _configure_from_env() -> None:
    level = os.environ.get("EAGERDECOMP_LOG", "").strip().upper()
    if not level:
        return
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        log.warning("EAGERDECOMP_LOG=%r is not one of debug, info, warning, error; ignored", level.lower())
        return
    log.setLevel(level)
    if not log.handlers:  # the application may have configured its own
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[eagerdecomp %(levelname)s] %(message)s"))
        log.addHandler(handler)


_configure_from_env()


def profiling() -> bool:
    """True while a ``torch.profiler`` / ``torch.autograd.profiler`` session records."""
    # NOTE: the profiler sets this Python flag on start and stop; reading it costs tens of
    # nanoseconds, where asking the C++ profiler state costs a call.
    return _profiler._is_profiler_enabled


def ranged(route: str, func, fn, *args):
    """``fn(*args)`` inside a profiler range named ``eagerdecomp.<route> <op>``."""
    with _RecordFunctionFast(f"eagerdecomp.{route} {func}"):
        return fn(*args)
