"""``python -m eagerdecomp.info``: what was built, what is loaded, and against which torch.

Example::

    >>> from eagerdecomp.info import collect
    >>> "torch" in collect()
    True
"""

from __future__ import annotations

import os
import warnings

import torch

__all__ = ["collect", "main"]


def _holds_a_library(folder) -> bool:
    return bool(folder) and os.path.isdir(folder) and any(f.endswith(".so") for f in os.listdir(folder))


def collect() -> dict:
    """The facts ``main`` prints, as a dict (never triggers a build)."""
    import eagerdecomp as ed
    from eagerdecomp import device
    from eagerdecomp.device import refdev
    from eagerdecomp.runtime import key
    from eagerdecomp.runtime import library as _ext

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _ext.ExtensionWarning)  # reported below instead
        lib = _ext.load()
    st = _ext.status()
    cache = _ext.cache_dir() if _ext.sources() else None
    return {
        "eagerdecomp": f"{ed.__version__} ({os.path.dirname(ed.__file__)})",
        "torch": f"{torch.__version__} ({os.path.dirname(torch.__file__)})",
        "C++ library": st["loaded"] + (f" ({st['path']})" if st["path"] else ""),
        "built against torch": st["built_with"],
        "why not loaded": st["error"] if lib is None and st["loaded"] != "disabled" else None,
        "EAGERDECOMP_NO_EXT": os.environ.get("EAGERDECOMP_NO_EXT") or "unset",
        "C++ sources": f"{len(_ext.sources())} file(s) under csrc/"
        if _ext.sources()
        else "none (installed from a wheel)",
        "just-in-time build cache": (f"{cache} ({'built' if _holds_a_library(cache) else 'empty'})" if cache else None),
        "cache key builder": key.IMPLEMENTATION,
        "C++ hit path / CPU tier": " / ".join(
            "built" if lib is not None and hasattr(lib, part) else "not built" for part in ("hit", "host")
        ),
        "reference device": f"{refdev.DEVICE_NAME} loaded"
        if refdev.is_loaded()
        else "not loaded (reference_device() loads it)",
        "PrivateUse1 backend name": torch._C._get_privateuse1_backend_name(),
        "device switch enabled for": ", ".join(device.enabled()) or "none",
        "EAGERDECOMP_DEVICES": os.environ.get("EAGERDECOMP_DEVICES")
        or os.environ.get("EAGERDECOMP_BACKENDS")
        or "unset",
    }


def main() -> None:
    for k, v in collect().items():
        if v is not None:
            print(f"{k:26} {v}")


if __name__ == "__main__":
    main()
