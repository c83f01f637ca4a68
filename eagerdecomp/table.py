"""Decomposition tables: plain dicts from ``OpOverload`` to a Python function.

The default table for an opset layers, highest priority first:

1. per-mode ``decompositions=`` passed to :class:`~eagerdecomp.EagerDecompMode`;
2. user fills registered with :func:`register_decomposition`;
3. eagerdecomp's own fills (``eagerdecomp/decomps.py``): ops PyTorch leaves
   without a decomposition, or decomposes wrongly;
4. ``torch._decomp``'s core-ATen table, written with aten ops (preferred
   when the opset has no prims, because prims run in Python in eager);
5. ``torch._decomp.decomposition_table``, mostly ``torch._refs``;
6. (at lowering time) an op's CompositeImplicitAutograd kernel.

Every op in the opset is dropped from the table: decompositions are bus stops
and we get off at the first one the backend serves.
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, Iterable

import torch
from torch._ops import OpOverload, OpOverloadPacket

from .errors import EagerDecompError
from .opset import OpSet, resolve_op
from .variants import foreach_table, variant_table

__all__ = ["register_decomposition", "default_table", "user_table"]

Table = Dict[OpOverload, Callable]

_USER: Table = {}
_PROJECT: Table = {}
# bumped on every registration so cached runtimes built from older tables are not reused
_version = itertools.count(1)
VERSION = 0


def _register(registry: Table, ops, fn: Callable, override: bool) -> Callable:
    global VERSION
    if isinstance(ops, (str, OpOverload, OpOverloadPacket)):
        ops = [ops]
    overloads = [o for op in ops for o in resolve_op(op)]
    for op in overloads:
        if op in registry and not override:
            raise EagerDecompError(
                f"a decomposition for {op} is already registered ({registry[op].__qualname__}); "
                "pass override=True to replace it"
            )
    for op in overloads:
        registry[op] = fn
    VERSION = next(_version)
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
    registry = _USER if _registry is None else _registry

    def wrap(fn):
        return _register(registry, ops, fn, override)

    return wrap


def project_decomposition(ops):
    """Decorator for eagerdecomp's own fills (used in ``eagerdecomp/decomps.py``)."""
    return register_decomposition(ops, _registry=_PROJECT)


def user_table() -> Table:
    return dict(_USER)


def _torch_core_table() -> Table:
    import torch._decomp as d

    post_autograd = getattr(d, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd else d.core_aten_decompositions())


def _all_aten_overloads() -> list:
    from .opset import _all_overloads

    return _all_overloads("aten")


def _prims_to_aten() -> Table:
    from .opset import _all_overloads

    return {op: op.impl_aten for op in _all_overloads("prims") if getattr(op, "impl_aten", None) is not None}


def _refs_by_name() -> Table:
    """aten overload -> ``torch._refs`` function of the same name, for prims targets.

    NOTE: many refs (select, narrow, ...) are not registered in torch._decomp's
    table; TorchRefsMode finds them by name, and so do we. Each trace is still
    checked against the op's meta kernel, so a mismatched ref errors, never lies.
    """
    import torch._refs as refs
    import torch._refs.nn.functional as refs_nn
    import torch._refs.special as refs_special

    table: Table = {}
    for op in _all_aten_overloads():
        name = op._schema.name.split("::")[-1]
        if torch.Tag.out in op.tags or name.startswith("_"):
            continue
        for ns in (refs, refs_nn, refs_special):
            fn = getattr(ns, name, None)
            if callable(fn):
                table[op] = fn
                break
    return table


def default_table(opset: OpSet, extra: Iterable = ()) -> Table:
    """The decomposition table used to lower ops into ``opset`` (see module docstring)."""
    import torch._decomp as d

    from . import decomps, rng  # noqa: F401  (register the project fills)

    prefers_aten = not any(op._schema.name.startswith("prims::") for op in opset.ops)
    table: Table = {} if prefers_aten else _refs_by_name()
    table.update(d.decomposition_table)
    table.update(foreach_table(_all_aten_overloads()))
    if prefers_aten:
        # NOTE: refs express in-place/out= ops and many others with prims, which run in
        # Python in eager; aten-based rules win, and prims left over lower through impl_aten.
        table.update(_prims_to_aten())
        table.update(_torch_core_table())
        # NOTE: our in-place/out= rules win over the core table's generic ones
        # (register_inplace): those copy_ the result back without eager's checks, so an int
        # tensor took a float result (x.logit_()) and a [1] tensor a [5, 5] one (addcmul_).
        # The refs a prims opset uses check through their out= wrapper.
        table.update(variant_table(_all_aten_overloads()))
    table.update(_PROJECT)
    table.update(_USER)
    table.update(extra)
    for op in opset.ops:
        table.pop(op, None)
    for op in [k for k in table if not isinstance(k, OpOverload)]:
        del table[op]
    return table
