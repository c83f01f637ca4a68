"""The C++ hit path, Python's side: install programs, hand out the table, serve misses.

Each kernel cache has a C++ table (``csrc/hit.cpp``) in front of it, shared by the
runtimes over it (each counts its own hits). The
table maps an exact key to a *program* (:mod:`eagerdecomp.program`): the key's
kernel as a straight-line list of boxed operator calls. A call whose key is there
is keyed, found and replayed in C++ with no Python; the mode's ``decompose`` asks
it first (one C++ call), and the device switch's C++ fallback asks it before
entering Python at all. On a miss Python does what it always did (trace, or replay
from its cache, or a shape-generic kernel) and then :func:`offer` installs the
program for that key, so the next call with it stays in C++.

The table is a cache of Python's cache: bounded as an approximate LRU (two generations
of half the bound each: a key used since the younger one began survives; a dropped key
returns at the cost of one specialization, not a trace), cleared with it, and its
per-op hit counters are merged into the runtime's report. Kernels with no program
(:class:`~eagerdecomp.program.NoProgram`: warnings to re-raise, sizes read from
intermediates...) stay on Python replay, with the reason in the report
(``OpRow.python_replay``). ``EAGERDECOMP_NO_EXT=1`` (or no C++ library) gives the
pure-Python path, with identical results.

With the disk cache on (:mod:`eagerdecomp.disk`), each installed program is also
written to disk under its C++ key words; a new process installs them all before
its first miss (:func:`preload`), so a warm process starts on C++ hits.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref

import torch

from eagerdecomp.ops.checks import ONCE
from eagerdecomp.ops.overlap import PARTIAL
from eagerdecomp.runtime import library as _ext
from eagerdecomp.runtime import program
from eagerdecomp.runtime.family import read_ints
from eagerdecomp.runtime.lift import Each
from eagerdecomp.runtime.program import NoProgram, Slot

__all__ = [
    "MISS",
    "table_for",
    "offer",
    "persist",
    "offer_host",
    "enabled",
    "clear_for",
    "hits_for",
    "preload",
    "saver",
]

# C++ returns this object on a miss (the op's outputs are never it)
MISS = type("Miss", (), {"__repr__": lambda self: "MISS", "__slots__": ()})()

MAXSIZE = int(os.environ.get("EAGERDECOMP_CACHE_SIZE", "4096"))
_NO_PROGRAM_MAX = 4096  # keys remembered as having no program, per runtime (then forgotten)

_tables: weakref.WeakSet = weakref.WeakSet()  # runtimes with a table, for clear_all
_lock = threading.Lock()
_init = []


def enabled() -> bool:
    """True when the C++ hit path is available (the library is loaded and has it)."""
    lib = _ext.load()
    return lib is not None and hasattr(lib, "hit")


def table_for(runtime) -> tuple:
    """``(table, counts)`` for ``runtime``, or ``(None, None)`` on the pure-Python path.

    NOTE: the table is its cache's (shared by every runtime over it, so a mode made per
    step starts with the programs earlier ones installed); the counts are the runtime's own.
    Under ``compile=`` the table is the compiler's: its programs may run compiled code, which
    a runtime without it must not.
    """
    if not enabled():
        return None, None
    lib = _ext.load()
    owner = runtime.cache if runtime.compiler is None else runtime.compiler
    with _lock:
        if not _init:
            lib.hit._init(MISS, PARTIAL)
            _init.append(True)
        table = getattr(owner, "hit_table", None)
        if table is None:
            table = owner.hit_table = lib.hit.Table(MAXSIZE)
        _tables.add(runtime)
    runtime._no_program = {}
    return table, lib.hit.Counts()


def _runtimes(cache) -> list:
    with _lock:
        return [rt for rt in _tables if rt.cache is cache and rt.hits is not None]


def clear_for(cache) -> None:
    """Empty the table in front of ``cache`` (when it is cleared) and its hit total."""
    table = getattr(cache, "hit_table", None)
    if table is not None:
        table.clear()
    cache.programs_read, cache.programs_preloaded = False, 0  # the next miss reads the disk's again
    for rt in _runtimes(cache):
        rt._no_program.clear()


def hits_for(cache) -> int:
    """Hits the table in front of ``cache`` served since it was last cleared."""
    table = getattr(cache, "hit_table", None)
    return table.total() if table is not None else 0


def _positions(positions) -> list:
    """lift.py's positions as the table reads them: ``(index or -1, name or "", each)``."""
    out = []
    for p in positions:
        each = type(p) is Each
        p = p.pos if each else p
        out.append((p, "", each) if type(p) is int else (-1, p, each))
    return out


def _changed(key, tensors) -> bool:
    """Whether a tensor's sizes, strides or offset differ from the key's (read before the call)."""
    metas = [p for p in key.parts if type(p) is tuple and len(p) == 7 and type(p[0]) is torch.Size]
    return len(metas) != len(tensors) or any(
        (m[0], m[1], m[2]) != (t.shape, t.stride(), t.storage_offset()) for m, t in zip(metas, tensors)
    )


def offer(runtime, miss, kernel, call=None, persist=True):
    """``kernel`` just answered ``miss``'s call correctly (:class:`~eagerdecomp.runtime.miss.Miss`):
    install its program for the call's key (the mode), or leave it for the device switch's C++
    fallback to install. ``call`` (compile=): the key's compiled code, which the program runs instead of its steps; such
    programs are not written to disk (the next process compiles, from Inductor's cache).
    ``persist=False``: installed to run this very call, not yet known correct; returns what
    :func:`persist` writes once it is (None when nothing was installed). Offered to a C++
    fallback (the device switch's, the mode's key), the program is installed there and, with
    ``persist=False``, not written to disk."""
    func, args, kwargs, key, tensors, n_lifted = (
        miss.func,
        miss.args,
        miss.kwargs,
        miss.key,
        miss.tensors,
        len(miss.lifted),
    )
    if key in runtime._no_program:
        return None
    try:
        if torch.Tag.inplace_view in func.tags or _changed(key, tensors):
            # NOTE: squeeze_, t_, a resized out=... changed an argument's sizes: installing reads
            # the key from the arguments after the call, which would file the program wrongly
            raise NoProgram("the call changes an argument's sizes or strides")
        ints = read_ints(kernel.ints, args, kwargs) if kernel.ints else ()
        plan = program.plan_for(kernel, len(tensors), n_lifted)
        sizes = program.sizes_at(plan, tensors, ints)
        lazy = (func, _positions(runtime._lift.get(func, ())), plan, sizes, n_lifted)
        via_cxx = runtime.via_cxx()
        if call is None and not via_cxx and plan[0] and plan[5]:
            words = _install_patched(runtime, func, args, kwargs, lazy, kernel, len(tensors))
        else:
            made = _program(*lazy, call)
            if via_cxx:
                runtime._tls.offer = made  # installed (and saved, see saver) by the C++ fallback
                # (not saved: the saver, called by the fallback as it installs, finds it here)
                runtime._tls.unsaved = None if persist else made
                return None
            words = runtime.hits.install(func, args, kwargs, *made[1:6], call)
        if words is not None:
            if not persist:
                return words, lazy
            store = runtime._store() if call is None else None
            if store is not None:
                _save(store, False, words, _program(*lazy, None))
            return None
        reason = "an argument the C++ key does not take"
    except NoProgram as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001 - the call succeeded; only its program is given up
        reason = f"not convertible: {type(e).__name__}: {str(e)[:120]}"
    if len(runtime._no_program) >= _NO_PROGRAM_MAX:
        runtime._no_program.clear()
    runtime._no_program[key] = None
    runtime.stats.python_replay(func, reason)
    return None


def persist(runtime, installed) -> None:
    """Write a program :func:`offer` installed with ``persist=False`` (its call was right)."""
    store = runtime._store()
    if installed is not None and store is not None:
        words, lazy = installed
        _save(store, False, words, _program(*lazy, None))


def _program(func, positions, plan, sizes, n_lifted, call) -> tuple:
    """The program tuple the table installs and the disk keeps, at these sizes."""
    return (func, positions, *program.filled(plan, sizes), Slot, n_lifted > 0, call)


def _install_patched(runtime, func, args, kwargs, lazy, kernel, n_tensors):
    """Install a shape family's new exact key by patching the program made at its first key:
    only the arguments that hold sizes are made again (in C++), not every step."""
    _, positions, plan, sizes, n_lifted = lazy
    made = kernel.plans.get(("program", n_tensors, n_lifted))
    if made is None:
        # NOTE: C++ data kept with the kernel's plan (never a live exception or frame)
        made = _ext.load().hit.template(*program.filled(plan, sizes), Slot)
        kernel.plans["program", n_tensors, n_lifted] = made
    return runtime.hits.install_patched(func, args, kwargs, positions, made, program.patches(plan, sizes), Slot)


def offer_host(runtime, func, device) -> None:
    """The CPU tier just ran this call: have the device's C++ fallback serve its key from now
    on, on the host, with no Python (never written to disk: the tier is this process's setting).
    The fallback files it under the key it read before the call (an out= may have been resized)."""
    runtime._tls.offer = (func, _positions(runtime._lift.get(func, ())), "host", runtime.host.token, device)


# -- programs on disk ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _library() -> str:
    """Names the C++ build whose key words a program is filed under (layout version, file)."""
    lib = _ext.load()
    st = os.stat(lib.__file__)
    return f"w{lib.hit.WORDS}-{st.st_size:x}-{st.st_mtime_ns:x}"


def _save(store, stack: bool, words, program) -> None:
    func, positions, calls, outputs, n_slots, _, lifted = program[:7]
    store.save_program(_library(), (stack, str(func), list(words), lifted, positions, calls, outputs, n_slots))


def saver(runtime):
    """The device fallback's ``on_install``: write each program it installs to disk."""

    def save(words, program):
        store = runtime._store()
        if program is getattr(runtime._tls, "unsaved", None):  # offered with persist=False
            runtime._tls.unsaved = None
        elif store is not None:
            _save(store, True, words, program)

    return save


def preload(runtime) -> int:
    """Install the programs earlier processes wrote for this runtime's cache (once per cache,
    before its first Python miss); returns how many. Off with the disk cache."""
    cache, store, table = runtime.cache, runtime._store(), runtime.hits
    if store is None or table is None or runtime.compiler is not None:
        return 0  # (under compile=, keys go through Python until the compiler has decided)
    with _lock:
        if getattr(cache, "programs_read", False):
            return 0
        cache.programs_read = True
    from eagerdecomp.runtime.disk import _op_from_name

    n = 0
    for stack, name, words, lifted, positions, calls, outputs, n_slots in store.load_programs(_library()):
        try:
            func = _op_from_name(name)
            if func in ONCE:  # (an older process's program: these ops now ask eager's flag in Python)
                continue
            table.install_words(func, stack, words, positions, calls, outputs, n_slots, Slot, lifted)
            n += 1
        except Exception:  # noqa: BLE001 - an op or device this process lacks: that key is a miss
            continue
    cache.programs_preloaded = getattr(cache, "programs_preloaded", 0) + n
    return n
