"""OpSet: the set of operator overloads a backend implements.

An opset is where decomposition stops. It is an immutable set of
``OpOverload`` objects with set algebra, built from overloads, packets or
names, plus two presets:

``core_aten``
    every overload tagged ``torch.Tag.core`` plus :data:`RUNTIME_EXTRAS`.
``prims``
    every ``prims::`` overload plus :data:`RUNTIME_EXTRAS` and the few aten
    ops that eager execution itself calls from C++ (``.item()``, ``resize_``):
    strict PrimTorch.
``prims_fusion``
    ``prims`` plus :data:`PRIMS_LIBRARY_OPS`, the few compute ops a backend with a
    fusion compiler keeps as library calls (matrix products, convolutions,
    indexing, sorting, random draws): what such a backend implements to run
    real models (see :data:`PRIMS_LIBRARY_OPS` for how they were chosen).

Example::

    >>> import torch, eagerdecomp as ed
    >>> ops = ed.OpSet.preset("core_aten")
    >>> torch.ops.aten.mm.default in ops, torch.ops.aten.silu.default in ops
    (True, False)
    >>> small = ed.OpSet(["aten::mul.Tensor", "aten.add"])  # a packet expands
    >>> len(small) > 2
    True
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable

import torch
from torch._ops import OpOverload, OpOverloadPacket

from eagerdecomp.errors import UnknownOpError
from eagerdecomp.ops.schema import op_from_name, op_names, overloads

__all__ = ["OpSet", "RUNTIME_EXTRAS", "PRIMS_LIBRARY_OPS", "PRESETS", "resolve_op", "resolve_reaching"]

aten = torch.ops.aten

# The smallest set of non-core ops that eager execution cannot do without.
# A decomposition graph is functional; eager semantics are not.
RUNTIME_EXTRAS = {
    # in-place and out= ops must write their result into the caller's tensor
    aten.copy_.default: "writes in-place and out= results into the caller's tensors",
    # metadata-mutating views (t_, squeeze_, transpose_...) change a tensor's
    # sizes and strides in place; as_strided_ is the one op that can express all of them
    aten.as_strided_.default: "applies metadata-mutating views (t_, squeeze_, ...) in place",
    # NOTE: set_ rebinds a tensor object to another storage (or a new empty one). It moves no
    # values, and no functional op expresses it: a graph makes new tensors, never points an
    # existing one at other memory. torch.load, pickle, copy.deepcopy (Parameter and buffer
    # copies: EMA and SWA models), share_memory_ and DataLoader workers' shared batches all
    # rebuild tensors with it, so every backend has it, as it has copy_.
    aten.set_.source_Storage: "rebinds a tensor to a storage at offset 0 (copy.deepcopy, share_memory_)",
    aten.set_.source_Storage_storage_offset: (
        "rebinds a tensor to a storage at an offset, size and stride (torch.load, pickle, Tensor.new(storage))"
    ),
    aten.set_.source_Tensor: "Tensor.set_(other): shares another tensor's storage, sizes and strides",
    # (CompositeImplicitAutograd: it calls set_.source_Storage_storage_offset and never reaches
    # a backend; listed so that the set_ family is whole in every preset)
    aten.set_.source_Tensor_storage_offset: "Tensor.set_(other, offset, size, stride): another tensor's storage",
    aten.set_.default: "Tensor.set_(): rebinds a tensor to a new empty storage",
}

# prims has no counterpart for these; C++ eager code calls them directly.
_PRIMS_ATEN_EXTRAS = {
    aten._local_scalar_dense.default: "Tensor.item() and data-dependent decompositions",
    aten.resize_.default: "out= arguments of the wrong size are resized as eager does",
}

# The compute ops a backend with a fusion compiler keeps as library calls beside prims.
# NOTE: chosen from the model corpora (eagerdecomp/coverage/data/models.json and PyTorch's
# pytorch_model_ops.json): under plain prims no model of either runs, and these are the ops
# whose absence blocks them (`python -m eagerdecomp coverage --opset prims --models --summary`
# ranks them), each one an op with no composition in prims that a fusion compiler's runtime
# calls a library for rather than generating code (Inductor's fallbacks and extern kernels).
# Ops that reach prims exactly are left out even where compilers keep them as library calls
# (attention: its decomposition is matmuls and a softmax; addmm: mm and an add a compiler
# fuses as the epilogue); a backend that wants them adds them (`OpSet.preset("prims_fusion")
# | [...]`). `docs/coverage.md` has the share of models each preset runs.
PRIMS_LIBRARY_OPS = {
    # matrix products: a GEMM library (cuBLAS, oneDNN, a vendor BLAS)
    aten.mm.default: "matrix product: a GEMM library call; prims has no matrix product",
    aten.bmm.default: "batched matrix product (attention, batched linear): a GEMM library call",
    # convolutions: a DNN library (cuDNN, oneDNN, MIOpen)
    aten.convolution.default: "convolution: a DNN library call; prims has no convolution",
    aten.convolution_backward.default: "convolution's gradients: the same library's backward call",
    # pooling: a windowed reduction, which prims (reductions over whole dims) cannot express
    aten.avg_pool2d.default: "average pooling (CNNs; adaptive pooling to a dividing size): a DNN library call",
    aten.avg_pool2d_backward.default: "average pooling's gradient: the same library's backward call",
    # indexing: data-dependent addresses, which prims (all shapes and strides static) cannot express
    aten.index.Tensor: "advanced indexing x[idx] (embeddings' backward, masks): a gather by tensor indices",
    aten.index_put.default: "x[idx] = v and index accumulation (embedding gradients): a scatter by tensor indices",
    aten.gather.default: "gather along a dim (cross-entropy's target pick, top-k routing)",
    aten.scatter.src: "scatter along a dim (one-hot, MoE routing)",
    aten.scatter.value: "scatter of a number along a dim (one-hot labels, masks)",
    aten.scatter_add.default: "scatter-add along a dim (gather's gradient, MoE combine)",
    # sorting and arg-reductions: prims reduces values only (amax, amin), never positions
    aten.sort.default: "sorting (top-p sampling, argsort): a sort kernel; no prims op orders values",
    aten.topk.default: "top-k (MoE routers, sampling): a selection kernel",
    aten.argmax.default: "position of the maximum (greedy decoding, accuracy); prims reduces values only",
    aten.max.dim: "max with its position (max pooling over a dim, routers); prims reduces values only",
    # NOTE: nonzero's output size is read from the values (x[mask], torch.where(cond)); prims'
    # shapes are all known before a kernel runs, so a composition must leave the device for
    # the count (.item()) and scatter the positions after it: two passes and a sync where a
    # backend's compaction kernel makes one (Inductor keeps nonzero as a fallback too).
    aten.nonzero.default: "positions of nonzero elements (boolean-mask indexing): a size read from the values",
    # random numbers: prims draws have no eager stream; these draw eager's numbers
    aten.rand.default: "uniform draws (dropout, nn.init): the device's generator, eager's stream",
    aten.bernoulli_.float: "bernoulli draws in place (dropout masks): the device's generator",
    # NOTE: CPU's randperm swaps with one whole 32-bit generator output per position
    # (random() % (n - i), random64() past n ~ 2**32 / 20); rand shows only the low 24 bits of
    # an output (float64: 53 of a pair), so no composition of rand or bernoulli_ draws its
    # permutation or leaves the generator where it does. Core ATen keeps randperm for the same
    # reason. random_ and randint stay decompositions, as under core ATen (decompositions/
    # randint.py): their values are eager's where the range divides 2**24 (2**53 for a 64-bit
    # draw), and for ranges up to 2**12 and every 64-bit draw they consume what eager's do, so
    # later draws are eager's; rng.STREAM_DIFFERS names the rest in the report.
    aten.randperm.default: "random permutations (DataLoader shuffles, index draws): the generator's own stream",
}

OpLike = str | OpOverload | OpOverloadPacket


def resolve_op(op: OpLike) -> list:
    """Expand ``op`` (an overload, a packet, or a name) into a list of ``OpOverload``.

    Raises :class:`UnknownOpError` naming the closest existing names.
    """
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, str):
        found = op_from_name(op.strip())
        if found is None and "::" not in op:  # "mul.Tensor": aten is the default namespace
            found = op_from_name("aten::" + op.strip())
        if found is None:
            wanted = op.strip().replace(".", "::", 1) if "::" not in op else op.strip()
            close = difflib.get_close_matches(wanted, op_names(), n=3, cutoff=0.75)
            hint = f"; did you mean {', '.join(close)}?" if close else "."
            raise UnknownOpError(
                f"unknown op name {op!r}: no registered operator has that name{hint} "
                "Names look like 'aten::add.Tensor', 'aten.add.Tensor' or a packet 'aten::add'."
            )
        op = found
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    raise UnknownOpError(
        f"cannot read {op!r} ({type(op).__name__}) as an op: expected an OpOverload, a packet or a name"
    )


def resolve_reaching(op: OpLike) -> frozenset:
    """Every overload a backend can meet when a user calls ``op`` (a name, packet or overload),
    for lists of ops by the names users type (``EAGERDECOMP_CPU_FALLBACK_DENY=linalg_eigh``).

    :func:`resolve_op` gives the overloads the name denotes; a backend often meets others:
    the in-place and out= variants of each (``_fused_adamw`` is called as ``_fused_adamw_``;
    a structured op's functional form reaches a device as its out= kernel), and, for a
    CompositeImplicitAutograd op, which never reaches a backend at all, the ops its composite
    calls (``linalg_eigh`` arrives as ``_linalg_eigh.eigenvalues``) with their variants.

    Raises :class:`UnknownOpError` for an unknown name, and for a CompositeImplicitAutograd op
    whose composite could not be run (:func:`eagerdecomp.ops.implicit.implemented_by`),
    naming the names that would reach what it calls.
    """
    from eagerdecomp.ops.implicit import implemented_by, is_implicit
    from eagerdecomp.ops.variants import variants

    found = set()
    for overload in resolve_op(op):
        for v in variants(overload):
            found.add(v)
            if not is_implicit(v):
                continue
            callees = implemented_by(v)
            if callees is None:
                raise UnknownOpError(_implicit_hint(op, v))
            for c in callees:
                found.update(variants(c))
    return frozenset(found)


def _implicit_hint(name, op) -> str:
    base = op._schema.name.partition("::")[2]
    guesses = [f"aten::{n}" for n in (f"_{base}", f"_{base.rstrip('_')}") if hasattr(aten, n)]
    shown = f" (by PyTorch's naming, probably {', '.join(dict.fromkeys(guesses))})" if guesses else ""
    return (
        f"{name!r}: {op} is a CompositeImplicitAutograd op, which never reaches a backend, and what its "
        "composite calls could not be found (no OpInfo samples of it ran: torch.testing needs expecttest); "
        f"expected a name of an op that arrives. Name the ops it is implemented by{shown}: the report's "
        "'cpu fallback' rows name the ops that arrived."
    )


class OpSet:
    """An immutable set of ``OpOverload``: the ops a backend runs itself."""

    __slots__ = ("ops", "name", "_hash")

    def __init__(self, ops: Iterable[OpLike] = (), name: str | None = None):
        resolved = set()
        for op in ops:
            resolved.update(resolve_op(op))
        self.ops = frozenset(resolved)
        self.name = name
        self._hash = hash(self.ops)

    @staticmethod
    def preset(name: str) -> OpSet:
        """Return a preset opset by name (see :data:`PRESETS`)."""
        try:
            return _PRESET_BUILDERS[name]()
        except KeyError:
            raise UnknownOpError(f"unknown opset preset {name!r}; presets are {sorted(_PRESET_BUILDERS)}") from None

    @classmethod
    def coerce(cls, opset: OpSet | str | Iterable[OpLike]) -> OpSet:
        """Read a preset name, an OpSet, or an iterable of ops as an OpSet."""
        if isinstance(opset, OpSet):
            return opset
        if isinstance(opset, str):
            return cls.preset(opset)
        return cls(opset)

    @classmethod
    def from_file(cls, path: str) -> OpSet:
        """One op name per line; blank lines and ``#`` comments are skipped."""
        with open(path) as f:
            names = [line.split("#", 1)[0].strip() for line in f]
        return cls([n for n in names if n], name=path)

    def __contains__(self, op) -> bool:
        return op in self.ops

    def __iter__(self):
        return iter(sorted(self.ops, key=str))

    def __len__(self) -> int:
        return len(self.ops)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, OpSet) and self.ops == other.ops

    def _combine(self, other, fn, sym) -> OpSet:
        other = OpSet.coerce(other)
        out = OpSet.__new__(OpSet)
        out.ops = fn(self.ops, other.ops)
        out.name = f"({self.name or 'custom'} {sym} {other.name or 'custom'})"
        out._hash = hash(out.ops)
        return out

    def __or__(self, other):
        return self._combine(other, frozenset.union, "|")

    def __sub__(self, other):
        return self._combine(other, frozenset.difference, "-")

    def __and__(self, other):
        return self._combine(other, frozenset.intersection, "&")

    union, difference, intersection = __or__, __sub__, __and__

    def __repr__(self) -> str:
        return f"OpSet({self.name or 'custom'}, {len(self)} ops)"

    def names(self) -> list:
        """Sorted op names, as ``aten::add.Tensor``."""
        return sorted(
            f"{op._schema.name}{'.' + op._overloadname if op._overloadname != 'default' else ''}" for op in self.ops
        )


@functools.cache
def _core_aten() -> OpSet:
    core = [op for op in overloads("aten") if torch.Tag.core in op.tags]
    return OpSet(core + list(RUNTIME_EXTRAS), name="core_aten")


# NOTE: PyTorch registers its prims views through torch.library.custom_op, which lets the
# conjugate and negative bits pass through them (a view keeps its base's bits, as aten's views
# do); prims.as_strided alone, declared as writing its input (Tensor(a!)), is registered the old
# way and gets PyTorch's math-bit fallback instead, which treats it as a write: x.conj().imag[0]
# (select decomposes to prims.as_strided) failed an internal assert, and a view's storage was
# measured in the view's dtype (x.conj().imag[:, 2] "out of bounds"). The fallthroughs
# aten.as_strided has, registered once for prims' (process-wide: it only ever makes it a view).
_MATH_BIT_KEYS = ("Conjugate", "Negative")
_math_bits_lib: list = []


def _prims_views_keep_math_bits() -> None:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if _math_bits_lib or all(has("prims::as_strided", k) for k in _MATH_BIT_KEYS):
        return
    lib = torch.library.Library("prims", "IMPL")  # noqa: TOR901 - kept for the process's lifetime
    for key in _MATH_BIT_KEYS:
        if not has("prims::as_strided", key):
            lib.impl("as_strided", torch.library.fallthrough_kernel, key)
    _math_bits_lib.append(lib)


@functools.cache
def _prims() -> OpSet:
    import torch._prims  # noqa: F401  (registers the prims:: namespace)

    _prims_views_keep_math_bits()
    ops = list(overloads("prims")) + list(RUNTIME_EXTRAS) + list(_PRIMS_ATEN_EXTRAS)
    return OpSet(ops, name="prims")


@functools.cache
def _prims_fusion() -> OpSet:
    return OpSet(list(_prims()) + list(PRIMS_LIBRARY_OPS), name="prims_fusion")


_PRESET_BUILDERS = {"core_aten": _core_aten, "prims": _prims, "prims_fusion": _prims_fusion}
PRESETS = tuple(_PRESET_BUILDERS)
