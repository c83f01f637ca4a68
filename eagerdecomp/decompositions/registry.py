"""Registration: the user's and the project's decomposition entries, and their version.

A leaf module (it imports nothing of ours but the errors and op resolution), so
the family modules (``pointwise``, ``rng``, ...) and :mod:`eagerdecomp.decompositions.table` can
all import it without a cycle. A table is a plain dict from ``OpOverload`` to a
function; registering a packet or a name expands to every overload, and a second
registration of an op raises unless ``override=True``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from torch._ops import OpOverload, OpOverloadPacket

from eagerdecomp.errors import EagerDecompError
from eagerdecomp.ops.opset import resolve_op

__all__ = ["register_decomposition", "project_decomposition", "version", "USER", "PROJECT", "Table"]

Table = dict[OpOverload, Callable]

USER: Table = {}  # register_decomposition(): the user's entries
PROJECT: Table = {}  # project_decomposition(): eagerdecomp's own decompositions
_versions = itertools.count(1)
_version = 0
_lock = threading.Lock()  # registration may run in any thread; the version must move with the table


def version() -> int:
    """Bumped on every registration, so runtimes built from an older table are not reused."""
    return _version


def _register(registry: Table, ops, fn: Callable, override: bool) -> Callable:
    global _version
    if isinstance(ops, (str, OpOverload, OpOverloadPacket)):
        ops = [ops]
    overloads = [o for op in ops for o in resolve_op(op)]
    with _lock:
        for op in overloads:
            if op in registry and not override:
                raise EagerDecompError(
                    f"a decomposition for {op} is already registered ({registry[op].__qualname__}); "
                    "pass override=True to replace it"
                )
        for op in overloads:
            registry[op] = fn
        _version = next(_versions)
    return fn


def register_decomposition(ops, *, override: bool = False, _registry: Table | None = None):
    """Decorator: register ``fn`` as the decomposition of ``ops`` for every opset.

    ``ops`` is an overload, a packet (expanded to all its overloads), a name,
    or a list of those. Registering an op twice raises unless ``override=True``.

    Example::

        >>> import torch, eagerdecomp as ed
        >>> @ed.register_decomposition("aten::hardswish", override=True)
        ... def hardswish(x):
        ...     return x * torch.clamp(x + 3, 0, 6) / 6
    """
    registry = USER if _registry is None else _registry

    def wrap(fn):
        return _register(registry, ops, fn, override)

    return wrap


def project_decomposition(ops):
    """Decorator for eagerdecomp's own decompositions (the modules in
    :data:`eagerdecomp.decompositions.table.FAMILY_MODULES`)."""
    return register_decomposition(ops, _registry=PROJECT)
