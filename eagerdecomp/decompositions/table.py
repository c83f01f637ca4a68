"""Decomposition tables: plain dicts from ``OpOverload`` to a Python function.

The default table for an opset layers, highest priority first:

1. per-mode ``decompositions=`` passed to :class:`~eagerdecomp.EagerDecompMode`;
2. user decompositions registered with :func:`register_decomposition`;
3. eagerdecomp's own decompositions (the family modules of :data:`FAMILY_MODULES`):
   ops PyTorch leaves without a decomposition, or decomposes wrongly;
4. ``torch._decomp``'s core-ATen table, written with aten ops (preferred
   when the opset has no prims, because prims run in Python in eager);
5. ``torch._decomp.decomposition_table``, mostly ``torch._refs``;
6. (at lowering time) an op's CompositeImplicitAutograd kernel.

Every op in the opset is dropped from the table: decompositions are bus stops
and we get off at the first one the backend serves.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable

import torch
from torch._ops import OpOverload

from eagerdecomp.decompositions.fft import PRIMS_FFT
from eagerdecomp.decompositions.prims_refs import PRIMS_TABLE
from eagerdecomp.decompositions.registry import PROJECT, USER, Table
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.ops.overlap import expanded_writer
from eagerdecomp.ops.schema import is_out, overloads
from eagerdecomp.ops.variants import foreach_table, rule_target, variant_table

aten = torch.ops.aten

__all__ = ["default_table", "FAMILY_MODULES"]

# eagerdecomp's own decompositions, one module per family; each registers its entries at import.
# Their import order does not change the table: a second registration of an op raises, so each
# op has one entry whatever the order.
FAMILY_MODULES = (
    "tensors",
    "amp",
    "conj",
    "rng",
    "generators",
    "randint",
    "multinomial",
    "attention",
    "indexing",
    "backward",
    "losses",
    "matmul",
    "order",
    "selection",
    "fft",
    "samplers",
    "twins",
    "quantize",
    "fractional",
    "embedding_bag",
    "grid_sample",
    "antialias",
    "resample",
    "linalg",
    "cholesky",
    "householder",
    "matfuncs",
    "ldl",
    "lstsq",
    "special",
    "integer",
    "pointwise",
    "polynomials",
    "pooling",
    "prims_misc",
    "scans",
    "margins",
    "spacing",
    "bessel",
    "histogram",
    "gamma",
    "rrelu",
    "segments",
    "prims_scatter",
    "rnn",
    "packed",
    "fused_optim",
    "fastpath",
)


def _torch_core_table() -> Table:
    import torch._decomp as d

    post_autograd = getattr(d, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd else d.core_aten_decompositions())


# NOTE: the tables below are functions of the dispatcher's aten overloads alone (read once) and
# cost about 15 ms to build: made once per process, not once per mode (a mode made per call
# paid them every time). Callers only copy from them.
@functools.cache
def _prims_to_aten() -> Table:
    return {op: op.impl_aten for op in overloads("prims") if getattr(op, "impl_aten", None) is not None}


@functools.cache
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
    for op in overloads("aten"):
        name = op._schema.name.split("::")[-1]
        if is_out(op) or name.startswith("_"):
            continue
        for ns in (refs, refs_nn, refs_special):
            fn = getattr(ns, name, None)
            if callable(fn):
                table[op] = fn
                break
    return table


def _unchecked_inplace(fn) -> bool:
    """Whether ``fn`` is one of torch's generic in-place rules: torch._decomp's ``register_inplace``
    (the functional op, then ``copy_`` into self with no dtype or shape check) or torch._refs'
    ``_make_inplace`` (the out= form with self as out: it resizes a self smaller than the broadcast
    shape, where eager refuses)."""
    import torch._refs as refs

    return getattr(fn, "__qualname__", "").startswith("register_inplace.") or (
        getattr(fn, "__code__", None) is refs.abs_.__code__  # (every _make_inplace wrapper's code)
    )


def _prims_variants(table: Table, opset: OpSet) -> Table:
    """Our in-place and out= rules a prims opset takes over the refs' (see the NOTEs)."""
    # NOTE: torch's generic in-place rules (logit_, ldexp_, lt_, clamp_max_, ... ) skip eager's
    # checks: an int64 tensor took logit_'s float result, a [5, 1] self lt_'s [5, 5] one. Our
    # in-place rule checks cast and shape as eager does; the functional op it calls still lowers
    # through the refs. The in-place and out= overloads no ref covers (mm.out, the special
    # functions' out=) take the same rule, so they reach the opset wherever their functional op
    # does; and so do those whose functional op has our own (or the user's) decomposition: a ref's
    # in-place form calls its functional ref directly, past it (geometric_ drew rand_like of an
    # int64 self, which has no uniform kernel).
    # NOTE: the refs' masked_fill_ and index_fill_ copy_ their result into self, which eager's
    # copy_ refuses where self overlaps itself (expanded); eager's own kernels warn and write,
    # as our rule does (ops/overlap.py: the ops eager lets write an expanded self).
    # NOTE: our random decompositions draw eager's stream from aten.rand and its kin: an opset
    # without aten.rand (plain prims) keeps the refs' prims draws for the random ones.
    ours = PROJECT.keys() | USER.keys()
    eager_draws = aten.rand.default in opset

    def ours_first(op, fn) -> bool:
        if op not in table:
            return True
        if torch.Tag.nondeterministic_seeded in op.tags and not eager_draws:
            return False
        return _unchecked_inplace(table[op]) or rule_target(fn) in ours or expanded_writer(op)

    return {op: fn for op, fn in _derived(variant_table).items() if ours_first(op, fn)}


@functools.cache
def _derived(make) -> Table:
    return make(overloads("aten"))


def default_table(opset: OpSet, extra: Iterable = ()) -> Table:
    """The decomposition table used to lower ops into ``opset`` (see module docstring)."""
    import torch._decomp as d

    for name in FAMILY_MODULES:
        importlib.import_module(f".{name}", __package__)

    prefers_aten = not any(op._schema.name.startswith("prims::") for op in opset.ops)
    table: Table = {} if prefers_aten else dict(_refs_by_name())
    table.update(d.decomposition_table)
    table.update(_derived(foreach_table))
    if prefers_aten:
        # NOTE: refs express in-place/out= ops and many others with prims, which run in
        # Python in eager; aten-based rules win, and prims left over lower through impl_aten.
        table.update(_prims_to_aten())
        table.update(_torch_core_table())
        # NOTE: our in-place/out= rules win over the core table's generic ones
        # (register_inplace): those copy_ the result back without eager's checks, so an int
        # tensor took a float result (x.logit_()) and a [1] tensor a [5, 5] one (addcmul_).
        # A prims opset takes them over the refs' in-place forms too (_prims_variants).
        table.update(_derived(variant_table))
    else:
        table.update(_prims_variants(table, opset))
        table.update(PRIMS_TABLE)  # refs that answer otherwise than eager (prims_refs.py)
        table.update(PRIMS_FFT)  # core ATen's real FFTs as FFT prims (fft.py)
    table.update(PROJECT)
    table.update(USER)
    table.update(extra)
    for op in opset.ops:
        table.pop(op, None)
    for op in [k for k in table if not isinstance(k, OpOverload)]:
        del table[op]
    return table
