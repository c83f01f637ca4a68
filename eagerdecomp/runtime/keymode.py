"""The mode on a C++ dispatch key: ``with EagerDecompMode():`` with no Python on a hit.

Entered on this path, the mode puts a dispatch key (``csrc/mode.h``'s ``kKey``, the one place
it is chosen) into the thread's *included* key set and its C++ state into the thread's debug
info; both travel to autograd's worker threads in ``at::ThreadLocalState``, and neither to any
other thread. The key's kernel (``csrc/hit.cpp``'s ``mode_kernel``) then sees every op below
autograd, as ``__torch_dispatch__`` would, and:

* passes opset ops, calls on fake, meta or Python-key tensors, and calls under
  ``no_dispatch()`` to the kernels below it (the key excluded while they run);
* serves every other op from the runtime's C++ table (the device switch's ``Fallback``,
  with the key excluded for every dispatcher call it makes);
* hands a miss to :func:`_handler`, the one door into Python, which routes it as
  ``__torch_dispatch__`` would and returns the key's program for C++ to install.

:func:`python_reason` says when the mode keeps the Python ``TorchDispatchMode`` path instead.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import torch

from eagerdecomp.runtime import hits, routes
from eagerdecomp.runtime import library as _ext
from eagerdecomp.runtime.cache import MODE_ENTRIES as _entries
from eagerdecomp.runtime.observe import log, profiling

try:  # dynamo's frame hook: a miss handled while compiled code runs must not be traced
    from torch._C._dynamo import eval_frame as _frames

    _hook, _set_hook = _frames.get_eval_frame_callback, _frames.set_eval_frame
except (ImportError, AttributeError):
    _hook = _set_hook = None

__all__ = ["python_reason", "enter", "leave", "key", "entries", "KeyModeWarning"]


class KeyModeWarning(UserWarning):
    """The mode's dispatch key is taken in this process: the mode runs its Python path."""


_lock = threading.Lock()
_slot: list = []  # [None] once the key's kernel is registered, [reason] when it cannot be


def key() -> str | None:
    """The mode's dispatch key, or None without the C++ library."""
    lib = _ext.load()
    return lib.mode.KEY if lib is not None and hasattr(lib, "mode") else None


def _registered() -> str | None:
    """Registers the key's kernel once per process; the reason it cannot be, or None."""
    if _slot:
        return _slot[0]
    with _lock:
        if not _slot:
            lib = _ext.load()
            try:
                lib.hit.register_mode()
                _slot.append(None)
            except RuntimeError as e:
                # NOTE: the slot is PyTorch's (Fake is reserved upstream for the C++ FakeTensor) or
                # another library's: a second fallback on it would fail, or replace theirs
                reason = f"its dispatch key is taken ({e})"
                _slot.append(reason)
                warnings.warn(
                    f"eagerdecomp: EagerDecompMode runs its Python path: {reason}. Results are the same; "
                    "each call crosses into Python. Report this with your torch version.",
                    KeyModeWarning,
                    stacklevel=4,
                )
    return _slot[0]


def python_reason(runtime) -> str | None:
    """Why the mode must take its Python path on this entry, or None for the C++ key."""
    if runtime.hits is None:
        return "no C++ library" if not _ext.disabled() else "EAGERDECOMP_NO_EXT=1"
    if os.environ.get("EAGERDECOMP_KEY_MODE", "1") == "0":
        return "EAGERDECOMP_KEY_MODE=0"
    if runtime.compiler is not None:
        return "compile= (the compiler decides per key in Python)"
    if torch._C._len_torch_dispatch_stack():
        # NOTE: the Python key outranks ours whatever the order of entry: under a Python mode
        # entered first, the C++ key would see ops before it does, not after
        return "a Python dispatch mode is active"
    lib = _ext.load()
    if lib.mode.included():
        return "the mode's key is already on in this thread (an EagerDecompMode inside another)"
    if profiling():
        return "a profiler is recording (its eagerdecomp ranges come from Python)"
    return _registered()


def _op(name: str, overload: str, cache={}):  # noqa: B006 - a per-process memo
    op = cache.get((name, overload))
    if op is None:
        ns, _, base = name.partition("::")
        op = cache[name, overload] = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    return op


def _handler(runtime):
    """What the key's C++ kernel calls on a miss: ``(out, program or None)``."""
    tls = runtime._tls

    def handler(name, overload, args, kwargs):
        prev = getattr(tls, "offer", None), getattr(tls, "cxx", False)
        tls.offer, tls.cxx = None, True  # the runtime offers the key's program back to C++ (hits.offer)
        hook = _set_hook(None) if _hook is not None and _hook() is not None else None
        try:
            return runtime(_op(name, overload), args, kwargs), tls.offer
        finally:
            if hook is not None:
                _set_hook(hook)
            tls.offer, tls.cxx = prev

    return handler


def state_for(runtime):
    """The runtime's C++ state (made once): its opset, table, counts and miss handler."""
    state = getattr(runtime, "_key_state", None)
    if state is None:
        lib = _ext.load()
        host = runtime.host.token if runtime.host is not None else 0
        # NOTE: record_function's enter and exit (around every optimizer step) pass through as
        # opset ops do: in C++, counted as the Python path counts them (handed to Python they
        # cost ~10 us a pair)
        ops = list(runtime.ops) + [op for op in routes.infrastructure_ops() if op not in runtime.ops]
        state = lib.hit.ModeState(runtime.hits, runtime.hit_counts, _handler(runtime), hits.saver(runtime), host, ops)
        runtime._key_state = state
        runtime.stats.key_passed = state  # the report reads its pass-through counts
    return state


def enter(runtime):
    """Put the mode's key on in this thread; returns the token :func:`leave` takes."""
    if not runtime.cache.programs_read:
        # NOTE: the programs earlier processes wrote go in before the first call: on this path a
        # miss is answered in Python, past the table (the Python path reads them at its first
        # miss and asks the table again; here the C++ kernel asked it already)
        hits.preload(runtime)
    token = _ext.load().hit.enter(state_for(runtime))
    _entries["C++ key"] += 1
    return token


def leave(token) -> None:
    _ext.load().hit.leave(token)


def entered_python(reason: str) -> None:
    _entries["Python"] += 1
    _log_once(reason)


@functools.lru_cache(maxsize=32)
def _log_once(reason: str) -> None:
    log.info("EagerDecompMode: Python TorchDispatchMode path (%s)", reason)


def entries() -> dict:
    """Mode entries per path since the process started: ``{"C++ key": n, "Python": m}``."""
    return dict(_entries)
