"""Kernel bundles: a read-only folder of pre-traced kernels, consulted after the disk cache.

A bundle is the persistent kernel cache (:mod:`eagerdecomp.runtime.disk`) of a process that
ran representative workloads (``python -m eagerdecomp cache build``, :mod:`eagerdecomp.workloads`),
plus a manifest, ``bundle.json``, that says what it was built for::

    DIR/bundle.json                        {"format", "torch", "eagerdecomp", "sources", "opsets", ...}
    DIR/kernels/<store folder>/...         entries as the disk cache writes them

A device package ships one and points ``EAGERDECOMP_BUNDLE`` at it (several, separated by
``os.pathsep``, are searched in order). A wheel of eagerdecomp ships one of its own, built from
:mod:`eagerdecomp.workloads` when the wheel is built (``setup.py``: :data:`SHIPPED`), searched
after those; ``EAGERDECOMP_SHIPPED_BUNDLE=0`` leaves it out. Each process then reads a kernel, a shape family or
a C++ program from its own disk cache first and from the bundles after it; it writes only to
its own cache, never to a bundle (a bundle may sit on a read-only file system, shared by
many users). ``EAGERDECOMP_CACHE_DIR=DIR`` also loads a bundle, as an ordinary, writable cache.

A bundle built for another torch, other eagerdecomp sources or another opset is *stale* or
*foreign*: it is ignored with one :class:`BundleWarning` per bundle and reason (the shipped
one silently: it is stale only in a checkout whose sources changed after it was built), and
every kernel it would have answered is traced as usual. The sources are compared by the same
fingerprint the disk cache keys its folders by, so a stale bundle can never answer wrongly:
its folder names are not ours.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import warnings
from pathlib import Path

import torch

__all__ = [
    "BundleWarning",
    "MANIFEST",
    "FORMAT",
    "SHIPPED",
    "roots",
    "folders_for",
    "write_manifest",
    "read_manifest",
]

MANIFEST = "bundle.json"
FORMAT = "eagerdecomp kernel bundle 1"  # bumped when the layout of a bundle changes

# the bundle a wheel ships (built by setup.py into the package; absent from a checkout)
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "bundle"

_warned: set = set()  # (bundle root, reason) already warned about in this process
_lock = threading.Lock()


class BundleWarning(RuntimeWarning):
    """A kernel bundle in ``EAGERDECOMP_BUNDLE`` is ignored: stale, foreign or unreadable."""


def roots() -> tuple:
    """The bundle folders ``EAGERDECOMP_BUNDLE`` names, in search order (empty ones dropped), then
    the shipped one where the package has it."""
    value = os.environ.get("EAGERDECOMP_BUNDLE", "")
    named = tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())
    if os.environ.get("EAGERDECOMP_SHIPPED_BUNDLE", "1") != "0" and (SHIPPED / MANIFEST).is_file():
        named += (SHIPPED,)
    return named


def read_manifest(root: Path) -> dict:
    """The manifest of the bundle at ``root``; raises ``OSError`` or ``ValueError`` when there is none."""
    data = json.loads((Path(root) / MANIFEST).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a bundle of this format ({FORMAT!r})")
    return data


def write_manifest(root: Path, sources: str, **fields) -> dict:
    """Write ``root``'s manifest: this process's versions and source fingerprint, then ``fields``."""
    from eagerdecomp import __version__

    data = {"format": FORMAT, "torch": torch.__version__, "eagerdecomp": __version__, "sources": sources, **fields}
    path = Path(root) / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return data


def _warn(root: Path, reason: str) -> None:
    if root == SHIPPED:  # (stale only in a checkout edited after building it: nothing to tell a user)
        return
    with _lock:
        if (str(root), reason) in _warned:
            return
        _warned.add((str(root), reason))
    warnings.warn(
        f"eagerdecomp: ignoring the kernel bundle {root} (EAGERDECOMP_BUNDLE): {reason}; "
        "its kernels are traced instead (rebuild it: python -m eagerdecomp cache build)",
        BundleWarning,
        stacklevel=4,
    )


@functools.lru_cache(maxsize=64)
def _manifest(root: str, mtime_ns: int):
    # NOTE: keyed by the manifest's mtime, so a bundle rebuilt in place is read again
    return read_manifest(Path(root))


def folders_for(folder: str, opset_name: str | None, sources: str) -> tuple:
    """The bundles' folders for the disk-cache folder named ``folder`` (an opset under our
    ``sources`` fingerprint), in search order; a bundle that has none is warned about once."""
    out = []
    for root in roots():
        try:
            manifest = _manifest(str(root), (root / MANIFEST).stat().st_mtime_ns)
        except (OSError, ValueError) as e:
            _warn(root, f"no readable manifest ({type(e).__name__}: {e})")
            continue
        if manifest.get("sources") != sources:
            from eagerdecomp import __version__

            differ = [
                f"{what} {theirs} (this process: {ours})"
                for what, theirs, ours in (
                    ("torch", manifest.get("torch"), torch.__version__),
                    ("eagerdecomp", manifest.get("eagerdecomp"), __version__),
                )
                if theirs != ours
            ] or ["eagerdecomp sources that differ from this process's"]
            _warn(root, "stale or foreign: built for " + ", ".join(differ))
            continue
        path = root / "kernels" / folder
        if not path.is_dir():
            built = ", ".join(sorted({str(v) for v in manifest.get("opsets", {}).values()})) or "none"
            _warn(root, f"it has no kernels for opset {opset_name or 'custom'} (built for: {built})")
            continue
        out.append(path)
    return tuple(out)
