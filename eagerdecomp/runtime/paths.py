"""Where eagerdecomp keeps what it writes to disk: one root for every cache.

The root is ``$EAGERDECOMP_CACHE_DIR``, or ``~/.cache/eagerdecomp`` when it is unset;
each user of it takes a subfolder (``cache_dir("coverage")``), so one variable moves,
and one ``rm -rf`` clears, all of them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(*parts: str) -> Path:
    """``<root>/<parts...>``, created if missing."""
    root = os.environ.get("EAGERDECOMP_CACHE_DIR") or Path.home() / ".cache" / "eagerdecomp"
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
