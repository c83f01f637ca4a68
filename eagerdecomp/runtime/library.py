"""The one place eagerdecomp loads its C++ library (``csrc/``).

:func:`load` returns the prebuilt extension ``eagerdecomp._C`` or None. Loading
it has no side effects: it only holds functions (the reference device
registers itself when :func:`eagerdecomp.device.refdev.reference_device` asks).
Without it, eagerdecomp runs its pure-Python path and warns once;
``EAGERDECOMP_NO_EXT=1`` forces that path without a warning. A library built
against another torch than the running one is not used either (one warning):
its operator calls would bind to another ABI, where a crash is the good outcome.
:func:`load` with ``build=True`` (used only by the reference device) compiles
``csrc/`` just in time when no prebuilt library exists, into a cache directory
keyed by the torch version and the sources' hash.

Example::

    >>> from eagerdecomp.runtime import library as _ext
    >>> lib = _ext.load()            # the module, or None on the pure-Python path
    >>> _ext.status()["loaded"] in ("prebuilt", "jit", "disabled", "missing", "not loaded")
    True
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
import threading
import time
import warnings

__all__ = ["load", "status", "disabled", "cache_dir", "sources", "ExtensionWarning"]

_CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")


class ExtensionWarning(UserWarning):
    """The C++ library is missing: eagerdecomp runs its pure-Python path."""


_lock = threading.Lock()
_state = {"lib": None, "loaded": "not loaded", "error": None, "build_s": None, "path": None, "built_with": None}


def disabled() -> bool:
    """True when ``EAGERDECOMP_NO_EXT=1`` forces the pure-Python path."""
    return os.environ.get("EAGERDECOMP_NO_EXT", "") == "1"


def sources() -> list:
    """The C++ sources (present in a source checkout or editable install only)."""
    return sorted(glob.glob(os.path.join(_CSRC, "*.cpp")))


def cache_dir() -> str:
    """Where just-in-time builds go: ``ext/`` under the cache root (:mod:`eagerdecomp.paths`),
    then one folder per torch version and sources' hash, so a stale build is never loaded."""
    import torch

    from eagerdecomp.runtime.paths import cache_dir as root_dir

    root = str(root_dir("ext"))
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(_CSRC, "*.cpp")) + glob.glob(os.path.join(_CSRC, "*.h"))):
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + f.read())
    return os.path.join(root, f"torch-{torch.__version__}", digest.hexdigest()[:16])


def _release(version: str) -> str:
    return version.split("+")[0]  # "2.13.0+cpu" and "2.13.0" are one ABI


def _prebuilt():
    import torch

    try:
        lib = importlib.import_module("eagerdecomp._C")
    except ImportError as e:
        _state["error"] = f"{type(e).__name__}: {e}"
        return None
    built = _state["built_with"] = getattr(lib, "BUILT_WITH_TORCH", None)
    if built is None or _release(built) != _release(torch.__version__):
        _state["error"] = (
            f"it was built against torch {built}, this is torch {torch.__version__}; rebuild it against this torch"
        )
        return None
    _state.update(lib=lib, loaded="prebuilt", path=getattr(lib, "__file__", None))
    return lib


def _jit():
    import torch.utils.cpp_extension as cpp

    srcs = sources()
    if not srcs:
        _state["error"] = f"no C++ sources under {_CSRC} (not a source checkout)"
        return None
    build_dir = cache_dir()
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.perf_counter()
    try:
        lib = cpp.load(
            name="eagerdecomp_C",
            sources=srcs,
            build_directory=build_dir,
            extra_cflags=["-O2"],
            verbose=os.environ.get("EAGERDECOMP_VERBOSE_BUILD") == "1",
        )
    except Exception as e:  # noqa: BLE001 - no compiler, no headers, a compile error...
        # the compiler's last lines say why; the whole log is rebuilt with EAGERDECOMP_VERBOSE_BUILD=1
        _state["error"] = f"just-in-time build in {build_dir} failed: ...{str(e)[-600:]}"
        return None
    _state.update(
        lib=lib,
        loaded="jit",
        build_s=time.perf_counter() - t0,
        path=getattr(lib, "__file__", None),
        built_with=getattr(lib, "BUILT_WITH_TORCH", None),
    )
    return lib


def load(build: bool = False):
    """The C++ library module, or None (pure-Python path; warned about once).

    ``build=True`` compiles it just in time (cached) when it is not prebuilt.
    """
    with _lock:
        if _state["lib"] is not None:
            return _state["lib"]
        if disabled():
            _state["loaded"] = "disabled"
            return None
        lib = _prebuilt()
        if lib is None and build:
            lib = _jit()
        if lib is None and _state["loaded"] != "missing":
            _state["loaded"] = "missing"
            warnings.warn(
                f"eagerdecomp: C++ library not available ({_state['error']}); using the pure-Python path. "
                "Build it with `pip install --no-build-isolation -e .` (needs a C++ compiler), "
                "or set EAGERDECOMP_NO_EXT=1 to silence this.",
                ExtensionWarning,
                stacklevel=3,
            )
        return lib


def status() -> dict:
    """What was loaded: ``loaded`` is prebuilt, jit, disabled, missing or not loaded."""
    return dict(_state)
