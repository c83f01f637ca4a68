"""Eager-exactness: what a traced kernel must match, and the fix-ups that make it match.

A trace is checked against the op's own meta kernel run on fresh fakes (its
eager output metadata) and against its schema:

* dtype, shape and device must match, else :class:`MismatchError`;
* an in-place/out= op must return its mutated input object, and a view op a
  view of its input, else :class:`MismatchError`;
* a functional op whose decomposition returns an input (or a view of one)
  gets a ``clone`` so the output does not alias, as in eager;
* a view op whose decomposition returns its input object gets an ``alias``;
* a fresh output whose significant strides differ from eager's is copied
  into an ``empty_strided`` of eager's strides.

:func:`unalias` applies the aliasing rule on the bypass path, where no kernel
is traced.
"""

from __future__ import annotations

import functools
import threading

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from eagerdecomp.errors import DeviceMismatchError, MismatchError
from eagerdecomp.ops.checks import check
from eagerdecomp.ops.schema import out_args, resizes_like_functional, returns_tensor
from eagerdecomp.runtime import metaref
from eagerdecomp.runtime.lower import IDENTITY_OPS
from eagerdecomp.runtime.quiet import issue_once, quiet

__all__ = [
    "fakes_like",
    "fakes_of",
    "metas_like",
    "reference",
    "Refusal",
    "refused",
    "finish_outputs",
    "unalias",
    "check_devices",
    "new_fake_mode",
    "concrete_fake_mode",
    "swap_tensors",
    "layout_matters",
    "relayout",
    "flat_tensors",
]

aten = torch.ops.aten


def swap_tensors(x, it):
    """Rebuild ``x`` (args, lists, tuples) taking tensors from iterator ``it`` in key order."""
    if isinstance(x, torch.Tensor):
        return next(it)
    if type(x) is list or type(x) is tuple:
        return type(x)(swap_tensors(y, it) for y in x)
    return x


def _storage(t):
    return StorageWeakRef(t.untyped_storage())


@functools.cache
def _indices_at(func) -> int | None:
    """Position of ``func``'s ``Tensor?[] indices`` argument, or None."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "indices" and str(a.type) == "List[Optional[Tensor]]":
            return i
    return None


# NOTE: arguments eager's kernel reads on the host, so eager wants them on the CPU whatever
# device the data is on (PyTorch asks for a CPU `lengths`: pack_padded_sequence's docs)
_HOST_ARGUMENTS = {
    aten._pack_padded_sequence.default: "lengths",  # read value by value to size the packed rows
}


def _cpu_indices(func, args, kwargs) -> set:
    # NOTE: eager lets index tensors stay on the CPU whatever device the indexed tensor is on
    # (x_cuda[idx_cpu] = v; SAM's relative positions on a device): the schema's `Tensor?[] indices`
    host = _HOST_ARGUMENTS.get(func)
    if host is not None:
        at = next(i for i, a in enumerate(func._schema.arguments) if a.name == host)
        t = args[at] if at < len(args) else (kwargs or {}).get(host)
        return {id(t)} if isinstance(t, torch.Tensor) and t.device.type == "cpu" else set()
    i = _indices_at(func)
    if i is None:
        return set()
    indices = args[i] if i < len(args) else (kwargs or {}).get("indices", ())
    return {id(t) for t in indices or () if isinstance(t, torch.Tensor) and t.device.type == "cpu"}


def check_devices(func, tensors, args=(), kwargs=None) -> None:
    """Raise :class:`DeviceMismatchError` where eager would: tensors on two devices, except
    0-dim CPU tensors, CPU index tensors and the arguments eager reads on the host (as eager
    allows them)."""
    cpu_ok = _cpu_indices(func, args, kwargs) if isinstance(func, torch._ops.OpOverload) else set()
    devices = {t.device for t in tensors if not (t.device.type == "cpu" and (t.dim() == 0 or id(t) in cpu_ok))}
    if len(devices) > 1:
        raise DeviceMismatchError(
            f"{func}: expected all tensor arguments on one device (0-dim CPU tensors excepted), "
            f"found {sorted(map(str, devices))}; move them to one device before the call"
        )


class _Ref:
    """Eager's output metadata for one call: the op's own meta kernel run on fresh fakes."""

    __slots__ = ("outs", "shares")

    def __init__(self, outs, inputs):
        self.outs = outs
        storages = {_storage(t) for t in inputs if t.layout == torch.strided}
        # NOTE: whether an output shares memory with an input is read from the meta kernel,
        # not the schema: unsafe_split/unsafe_chunk return views with no alias annotation.
        self.shares = [
            isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in storages for o in outs
        ]

    def out(self, i):
        return self.outs[i] if i < len(self.outs) else None

    def frozen(self) -> _Ref:
        """This metadata for other threads to read: its outputs as fakes of a mode no kernel ever
        runs in. NOTE: a fake's ``device`` reads ``meta`` while its own mode runs a kernel, in any
        thread: a key's metadata kept for its next direct call (runtime/tiers.py) read by another
        thread while the maker's per-thread mode ran a meta kernel said "eager gives ... on meta"."""
        global _FROZEN
        if _FROZEN is None:
            _FROZEN = FakeTensorMode()
        with _disable_current_modes():
            outs = [
                FakeTensor(_FROZEN, _meta_like(o), o.device)
                if isinstance(o, torch.Tensor) and o.layout == torch.strided
                else o
                for o in self.outs
            ]
        ref = _Ref(outs, ())
        ref.shares = self.shares
        return ref


_FROZEN = None  # the fake mode of frozen metadata (_Ref.frozen), made at first use


def _meta_like(t):
    """A meta tensor of ``t``'s dtype, sizes, strides and storage offset."""
    extent = t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return torch.empty((extent,), dtype=t.dtype, device="meta").as_strided(t.shape, t.stride(), t.storage_offset())


def refused(ref):
    """``(ref, refusal)``: a :func:`reference` split into the metadata (None on a refusal) and
    the :class:`Refusal` (or None)."""
    return (None, ref) if isinstance(ref, Refusal) else (ref, None)


def real_kernels_ok(tensors) -> bool:
    """Whether fake tensors of ``tensors`` may run an op's real kernel on zeros (FakeTensorMode's
    fallback for an op with no meta kernel: its only way to know eager's output layout).

    NOTE: not on a PrivateUse1 device, the one the switch serves: the real kernel there is our
    own fallback, re-entered with fakes inside ``no_dispatch`` where nothing can be traced. Such
    an op has no meta reference there, and a call of it inside a trace is decomposed eagerly.
    """
    name = torch._C._get_privateuse1_backend_name()
    return not any(t.device.type == name for t in tensors)


def new_fake_mode(shape_env=None, tensors=()) -> FakeTensorMode:
    mode = FakeTensorMode(shape_env=shape_env, allow_fallback_kernels=real_kernels_ok(tensors))
    # NOTE: FakeTensorMode's dispatch cache is class-wide and unbounded, keyed by shapes: with
    # shapes that change every call it grows for the life of the process. Our kernel cache is
    # the bounded one; a trace meets each (op, shape) about once, so the fake cache buys little.
    mode.cache_enabled = False
    return mode


_local = threading.local()


def concrete_fake_mode(tensors) -> FakeTensorMode:
    """This thread's fake mode for references at concrete sizes of ``tensors``, made once.

    NOTE: FakeTensorMode() records the stack it is made on, which costs a third of a
    reference in a deep program (a model's forward under ``generate()``). Only fakes made by
    :func:`fakes_like` may use it: ``from_tensor`` memoizes real tensors in the mode.
    """
    mode = getattr(_local, "mode", None)
    if mode is None:
        mode = _local.mode = new_fake_mode()
    mode.allow_fallback_kernels = real_kernels_ok(tensors)
    return mode


def fakes_like(mode, tensors, layouts=None) -> list:
    """Fakes of ``tensors`` (key order; one fake per object) with ``layouts`` (``(sizes,
    strides, offset)`` per tensor, symbolic or not; default: the tensors' own).

    NOTE: built from sizes and strides, not ``from_tensor`` (a third of a reference's cost),
    so only for calls whose distinct tensors share no memory, without conj/neg bits: what
    a shape family admits. A strided or offset tensor views a storage just long enough.
    Each is a meta tensor wrapped as FakeTensorMode wraps a factory's output, without
    dispatching through the mode (12x cheaper; 2.5x with symbolic sizes).
    """
    return fakes_of(mode, tensors, metas_like(tensors, layouts))


def plain(tensors) -> bool:
    """Whether :func:`fakes_like` may stand for ``tensors`` (key order): strided, not empty, no
    conj or neg bit, and distinct objects never sharing memory (what a shape family admits)."""
    seen: dict = {}
    for t in tensors:
        if t.layout is not torch.strided or t.is_conj() or t.is_neg() or t.numel() == 0:
            return False
        # NOTE: the storage's identity, not its data pointer: asking a lazily cloned (copy-on-write)
        # storage for its pointer copies it, where eager's kernels that only read leave it shared
        if seen.setdefault(t.untyped_storage()._cdata, t) is not t:
            return False
    return True


def metas_like(tensors, layouts=None) -> list:
    """The meta tensors :func:`fakes_like` wraps, one per object (key order, a repeated object's
    meta repeated). A family trace wraps the same metas for each fake mode it needs: with
    symbolic sizes, making a meta is most of what a fake costs (its layout is reasoned about in
    sympy), and the reasoning's answers do not depend on how many times it is asked."""
    memo: dict = {}
    out = []
    with _disable_current_modes():  # the meta tensors below are ours: no mode may see them
        for j, t in enumerate(tensors):
            meta = memo.get(id(t))
            if meta is None:
                sizes, strides, offset = (
                    layouts[j] if layouts is not None else (t.shape, t.stride(), t.storage_offset())
                )
                if t.storage_offset() == 0 and _dense(t.shape, t.stride()):
                    meta = torch.empty_strided(sizes, strides, dtype=t.dtype, device="meta")
                else:
                    extent = offset + 1 + sum((n - 1) * st for n, st in zip(sizes, strides))
                    meta = torch.empty((extent,), dtype=t.dtype, device="meta").as_strided(sizes, strides, offset)
                memo[id(t)] = meta
            out.append(meta)
    return out


def fakes_of(mode, tensors, metas) -> list:
    """Fakes of ``tensors`` in ``mode`` over ``metas`` (:func:`metas_like`): new tensors (their own
    sizes, a storage shared with the metas'), one per object."""
    memo: dict = {}
    out = []
    with _disable_current_modes():
        for t, meta in zip(tensors, metas):
            f = memo.get(id(t))
            if f is None:
                f = memo[id(t)] = FakeTensor(mode, meta, t.device)
            out.append(f)
    return out


def _dense(shape, stride) -> bool:
    expected = 1
    for d in sorted(range(len(shape)), key=lambda d: -stride[d], reverse=True):
        if shape[d] != 1 and stride[d] != expected:
            return False
        expected *= shape[d]
    return True


@functools.cache
def _no_meta() -> tuple:
    """What fake tensors raise when they cannot run an op's meta kernel: no kernel, a data
    value or a data-dependent shape needed. None of these says the call itself is invalid.

    NOTE: a function, not a module constant: symbolic_shapes (and sympy under it) is
    imported at the first failed meta kernel, not by ``import eagerdecomp``.
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (
        NotImplementedError,
        UnsupportedOperatorException,
        UnsupportedFakeTensorException,
        DataDependentOutputException,
        DynamicOutputShapeException,
        GuardOnDataDependentSymNode,
    )


class Refusal:
    """The meta kernel rejected the call's arguments (a :func:`reference` with ``refuse=True``):
    eager rejects them too. Raised once a decomposition is known to compute something for them;
    where the decomposition raises an error of its own, that error stands (eager's message,
    more often than the meta kernel's)."""

    def __init__(self, error: BaseException):
        self.error = error


# NOTE: meta kernels that reject what the kernel eagerdecomp stands for accepts, each with why.
_META_STRICTER = {
    aten._grouped_mm.default: "its meta kernel requires CUDA's bf16 inputs; the CPU kernel takes float32",
    aten.histc.default: "its meta kernel rejects integers as the CPU kernel does; eagerdecomp bins them as CUDA",
    aten.histc.out: "as histc",
    aten.normal.out: "its meta kernel is torch's ref `normal`, which reads this overload's self as the mean and raises",
}


def reference(func, args, kwargs, mode=None, fakes=None, refuse=False, concrete=False):
    """Eager's output metadata for this call (a :class:`_Ref`); None if the op has no meta kernel.

    ``mode`` and ``fakes`` (the call's tensors in key order) are given for a family trace,
    whose fakes have symbolic sizes. ``refuse=True`` first raises what :mod:`eagerdecomp.checks`
    knows eager raises, then answers a rejection by the meta kernel with a :class:`Refusal`
    (one it checks with AssertionError is raised at once, as eager's RuntimeError). ``concrete``:
    ``fakes`` are :func:`fakes_like`'s at concrete sizes, whose meta kernel may then run without
    the mode's whole dispatch (:mod:`eagerdecomp.runtime.metaref`).
    """
    if refuse:
        check(func, args, kwargs)
    on_host = None  # a call on the switch's device: eager's layout on the CPU if the op has no meta kernel
    if mode is None:
        tensors = flat_tensors(args, kwargs)
        mode = new_fake_mode(tensors=tensors)
        fakes = [mode.from_tensor(t) for t in tensors]
        if not real_kernels_ok(tensors):
            on_host = tensors
    moved = _cpu_indices(func, args, kwargs)
    if moved:
        fakes = _indices_on_device(mode, flat_tensors(args, kwargs), fakes, moved)
    it = iter(fakes)
    fargs = swap_tensors(args, it)
    fkwargs = {k: swap_tensors(v, it) for k, v in kwargs.items()}
    like_functional = resizes_like_functional(func)
    before = (
        [_layout(fkwargs[name]) for name in out_args(func) if isinstance(fkwargs.get(name), torch.Tensor)]
        if like_functional
        else ()
    )
    quick = None
    if concrete and not moved and not like_functional and metaref.applies(func):
        quick = metaref.answer(func, fargs, fkwargs, mode)
    if quick is not None:
        outs, caught = tree_flatten(quick[0])[0], quick[1]
    else:
        outs, caught = _fake_outputs(func, args, kwargs, fargs, fkwargs, mode, on_host, refuse)
        if outs is None or isinstance(outs, (_Ref, Refusal)):
            return outs
    issue_once(caught)
    if func in _META_LAYOUT_FIXES:
        with mode:
            outs = [_META_LAYOUT_FIXES[func](o, fargs) for o in outs]
    if like_functional and len(before) == len(outs):
        outs = _kept_layouts(outs, before, mode)
        shapes = [shape for shape, _, _ in before]
        if any(b != o.shape for b, o in zip(shapes, outs)):
            outs = _functional_strides(func, fargs, fkwargs, outs, shapes, mode)
    return _Ref(outs, fakes)


def _fake_outputs(func, args, kwargs, fargs, fkwargs, mode, on_host, refuse):
    """``(flat outputs, caught warnings)`` of the meta kernel run on the fakes; or ``(answer,
    None)`` where :func:`reference` answers at once: None, a :class:`Refusal`, or the CPU's layout."""
    try:
        # the real call warns for itself, but for eager's once-per-process warnings: the meta
        # function that raises them is eager's own, and its flag fires here (quiet.py)
        with quiet() as caught, mode:
            out = func(*fargs, **fkwargs)
    except _no_meta():
        if on_host is None or func._schema.is_mutable:
            return None, None
        return _host_reference(func, args, kwargs, on_host), None
    except AssertionError as e:
        # NOTE: Python meta kernels (many are PyTorch's decompositions) check arguments with
        # AssertionError where eager's TORCH_CHECK raises RuntimeError, with the same message;
        # the decomposition would raise the AssertionError itself
        if refuse and _refused_by_the_op_itself(e) and func not in _META_STRICTER:
            raise RuntimeError(str(e)) from None
        return None, None
    except (RuntimeError, ValueError, IndexError) as e:  # what argument checks raise (torch._check...)
        if refuse and _refused_by_the_op_itself(e) and func not in _META_STRICTER:
            return Refusal(e), None
        return None, None
    except Exception:  # noqa: BLE001 - a meta kernel's own bug (None.device): says nothing of the call
        return None, None
    return tree_flatten(out)[0], caught


def eager_reference(func, args, kwargs, tensors=None, known=None) -> tuple:
    """``(metadata, refusal)``: :func:`reference` with ``refuse=True`` for a call about to run
    direct or be traced (``tensors``: its tensors in key order); ``known``: this key's metadata,
    taken at an earlier call of it (then only the checks by value run).

    NOTE: over this thread's one fake mode and fakes built from sizes and strides where the
    tensors allow it: a fresh FakeTensorMode and ``from_tensor`` per call cost more than most
    decompositions' ops (4 ms against tens of microseconds).
    """
    if known is not None:
        check(func, args, kwargs)  # (what eager refuses by value, which the key does not hold)
        return known, None
    with _disable_current_modes():  # the meta kernel's calls are no mode's to see
        if tensors is not None and plain(tensors):
            mode = concrete_fake_mode(tensors)
            ref = reference(func, args, kwargs, mode, fakes_like(mode, tensors), refuse=True, concrete=True)
            # (an op with no meta kernel on the switch's device: eager's layout from the CPU's
            # kernel, which only the full reference asks)
            if ref is not None or real_kernels_ok(tensors):
                return refused(ref)
        return refused(reference(func, args, kwargs, refuse=True))


def _indices_on_device(mode, tensors, fakes, moved) -> list:
    """``fakes`` (of ``tensors``) with those of the CPU index tensors in ``moved`` (ids) on the
    data's device. NOTE: eager's kernel takes such indices whatever the data's device (it moves
    them: x_dev[idx_cpu], and its backward's index_put_); FakeTensor's device check refuses the
    mix, which made the meta kernel refuse what eager runs (SAM's relative positions on edref)."""
    device = next((t.device for t in tensors if t.device.type != "cpu"), None)
    if device is None:
        return fakes
    out = list(fakes)
    with _disable_current_modes():
        for j, t in enumerate(tensors):
            f = out[j] if j < len(out) else None
            if id(t) in moved and f is not None and all(type(n) is int for n in (*f.shape, *f.stride())):
                out[j] = FakeTensor(mode, _meta_like(f), device)
    return out


def _layout(t) -> tuple:
    return t.shape, t.stride(), t.storage_offset()


def _kept_layouts(outs, before, mode) -> list:
    """The out= tensors of a call as eager leaves those it did not resize: as they were.

    NOTE: these kernels' generated ``resize_out`` (and TensorIterator's) restride an out only
    when they resize it; one of the right shape keeps its strides and the kernel writes into it
    (through a proxy of its own strides). Some Python meta kernels restride it regardless
    (``_linalg_solve_ex`` makes a right-sized row-major ``result`` column-major), which made
    every decomposed ``linalg.solve(A, B, out=o)`` restride ``o`` to match them.
    """
    kept = []
    for o, (shape, stride, offset) in zip(outs, before):
        if isinstance(o, torch.Tensor) and o.shape == shape and (o.stride() != stride or o.storage_offset() != offset):
            with mode:
                o = o.as_strided(shape, stride, offset)
        kept.append(o)
    return kept


def _host_reference(func, args, kwargs, tensors):
    """Eager's output layout for a functional op with no meta kernel, called on the switch's
    device: its CPU kernel run on zeros (FakeTensorMode's fallback) over stand-ins with the
    tensors' layouts, moved back to their device; None if that cannot run.

    NOTE: on the device the fallback kernel is our own (:func:`real_kernels_ok`), so without
    this such an op (``geqrf``, whose LAPACK result is column-major) had no layout to be held
    to, and a decomposition's row-major result went through. The CPU kernel's layout is the one
    edref and PyTorch's device-generic tests expect; it is not taken as a refusal (zeros can
    fail where the call's values do not: a Cholesky of a zero matrix).
    """
    mode = new_fake_mode()  # (no device tensors: the real kernels may run)
    cpu = torch.device("cpu")
    host = {id(t): t.device for t in tensors if t.device.type != "cpu"}
    if not host:
        return None
    try:
        with _disable_current_modes():
            fakes = [
                FakeTensor(mode, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), cpu)
                for t in tensors
            ]
        it = iter(fakes)
        fargs = swap_tensors(args, it)
        fkwargs = {k: (cpu if k == "device" and v is not None else swap_tensors(v, it)) for k, v in kwargs.items()}
        with quiet(), mode:
            out = func(*fargs, **fkwargs)
        device = next(iter(host.values()))
        with _disable_current_modes():
            outs = [
                FakeTensor(mode, torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta"), device)
                if isinstance(o, torch.Tensor)
                else o
                for o in tree_flatten(out)[0]
            ]
    except Exception:  # noqa: BLE001 - no layout to hold the decomposition to, as before
        return None
    return _Ref(outs, [])


def _refused_by_the_op_itself(e) -> bool:
    """Whether the meta kernel of the op called raised ``e``, not the meta kernel of an op it
    called in turn. NOTE: a meta kernel written in Python runs other ops, whose own meta
    kernels may reject what the kernel accepts (gather's index dtype inside nll_loss's, with
    a uint8 target eager takes): a limit of the meta kernel, not a refusal of the call. Each
    op dispatched to the fake mode passes its _dispatch_impl once."""
    depth, tb = 0, e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "_dispatch_impl" and code.co_filename.endswith("fake_tensor.py"):
            depth += 1
        tb = tb.tb_next
    return depth <= 1


def _functional_strides(func, fargs, fkwargs, outs, before, mode):
    """Resized out= tensors as their kernels leave them (structured or TensorIterator ones):
    with the strides of the functional op's results. NOTE: meta kernels resize them contiguous."""
    from eagerdecomp.ops.variants import functional_variant

    functional = functional_variant(func)
    if functional is None:
        return outs
    kwargs = {k: v for k, v in fkwargs.items() if k not in out_args(func)}
    try:
        with quiet(), mode:
            results = tree_flatten(functional(*fargs, **kwargs))[0]
    except Exception:  # noqa: BLE001 - keep the meta kernel's answer
        return outs
    if len(results) != len(outs):
        return outs
    fixed = []
    for out, shape, result in zip(outs, before, results):
        if shape == out.shape or not isinstance(result, torch.Tensor) or result.shape != out.shape:
            fixed.append(out)  # (not resized by this call)
            continue
        if functional in _META_LAYOUT_FIXES:
            with mode:
                result = _META_LAYOUT_FIXES[functional](result, fargs)
        if not _dense(result.shape, result.stride()):
            fixed.append(
                out
            )  # (eager resizes an out dense; a meta kernel that kept a strided input's strides is not it)
            continue
        with mode:
            fixed.append(out.as_strided(out.shape, result.stride(), out.storage_offset()))
    return fixed


def _suggested_layout(out, args):
    # NOTE: the kernel allocates its output as its input suggests (channels-last stays
    # channels-last, anything else becomes contiguous); the meta kernel keeps the input's
    # strides. Outputs of another rank (batch norm's saved statistics) are left alone.
    if out.dim() != args[0].dim():
        return out
    return out.contiguous(memory_format=torch._prims_common.suggest_memory_format(args[0]))


def _cpu_suggested_layout(out, args):
    return _suggested_layout(out, args) if args[0].device.type == "cpu" else out


def _pointwise_layout(out, args):
    # NOTE: the kernel is one TensorIterator over its two tensor inputs, whose output follows
    # their strides (the first's where they disagree), as mul's does; the Python meta kernel
    # decides otherwise (contiguous, or the second input's layout)
    return aten.mul.Tensor(args[0], args[1]).to(out.dtype)


def _contiguous(out, args):
    # NOTE: the kernel (and its C++ meta) allocates a contiguous output; the Python meta
    # kernel keeps the input's layout
    return out.contiguous()


def _cpu_contiguous(out, args):
    # NOTE: the CPU kernel allocates contiguous outputs whatever the input's layout
    return out.contiguous() if args[0].device.type == "cpu" else out


def _cpu_roll_layout(out, args):
    # NOTE: the CPU kernel rolls one dimension at a time as narrow + cat, and cat keeps a
    # channels-last input channels-last (an empty input is cloned as it is laid out); the
    # meta kernel, like CUDA's, makes a contiguous result. No dims: a flattened roll, contiguous.
    x, shifts, dims = args[0], args[1], (args[2] if len(args) > 2 else ())
    if x.device.type != "cpu" or not dims:
        return out
    if x.numel() == 0:
        return torch.empty_like(x)
    for shift, d in zip(shifts, dims):
        n = x.shape[d]
        start = (n - shift) % n
        x = torch.cat([x.narrow(d, start, n - start), x.narrow(d, 0, start)], d)
    return x


# NOTE: meta kernels whose strides are not eager's (found by the conformance suite and a layout
# fuzzer); the reference is what the trace restrides to, so it must be eager's layout.
_META_LAYOUT_FIXES = {
    aten.max_unpool2d.default: _suggested_layout,  # eager keeps a channels-last input channels-last
    aten.roll.default: _cpu_roll_layout,
    aten.log_sigmoid_forward.default: _cpu_contiguous,
    **dict.fromkeys(
        [
            aten.native_dropout_backward.default,
            aten.copysign.Tensor,
            aten.floor_divide.default,
            aten.div.Tensor_mode,
            aten.heaviside.default,
            aten.hardsigmoid_backward.default,
            aten.hardswish_backward.default,
            aten.logaddexp.default,
            aten.logaddexp2.default,
            aten.xlogy.Tensor,
            aten.logical_and.default,
            aten.logical_or.default,
            aten.logical_xor.default,
        ],
        _pointwise_layout,
    ),
    **dict.fromkeys([aten.isin.Tensor_Tensor, aten.normal.Tensor_Tensor, aten.normal.float_Tensor], _contiguous),
    # (a layer norm's output or a fresh sum: contiguous; the meta kernel keeps a permuted src's layout)
    aten._transformer_encoder_layer_fwd.default: _contiguous,
    aten.channel_shuffle.default: _cpu_suggested_layout,  # (other devices: a composite of views)
    **dict.fromkeys(
        [
            aten.native_batch_norm.default,
            aten._native_batch_norm_legit.default,
            aten._native_batch_norm_legit.no_stats,
            aten._native_batch_norm_legit_functional.default,
            aten._native_batch_norm_legit_no_training.default,
            aten._batch_norm_with_update.default,
            aten._batch_norm_with_update_functional.default,
            aten._batch_norm_no_update.default,
        ],
        _suggested_layout,
    ),
}


def _call(func, args, kwargs):
    return func(*args, **kwargs)


def flat_tensors(args, kwargs) -> list:
    out: list = []

    def visit(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif type(x) is list or type(x) is tuple:
            for y in x:
                visit(y)

    visit(args)
    visit(list(kwargs.values()))
    return out


def _return_alias(schema, i: int):
    """``(input name, is_write)`` of the argument return ``i`` aliases, or None."""
    if not schema.returns:
        return None
    ret = schema.returns[min(i, len(schema.returns) - 1)]
    info = ret.alias_info
    if info is None:
        return None
    for arg in schema.arguments:
        a = arg.alias_info
        if a is not None and (a.before_set & info.before_set or not info.before_set):
            return arg.name, info.is_write
    return None


def _arg_by_name(schema, args, kwargs, name):
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return args[i] if i < len(args) else kwargs.get(name)
    return None


def same_strides(r, o) -> bool:
    """The strides of every dimension longer than 1 agree.

    NOTE: not torch._prims_common.check_significant_strides, which skips every symbolic
    stride (calls it equal): over symbolic sizes each comparison here must be decided, and
    so guarded, for a shape-generic kernel's restride to be right at every shape.
    """
    for n, a, b in zip(r.shape, r.stride(), o.stride()):
        if n > 1 and a != b:
            return False
    return True


def _surely_same_strides(r, o) -> bool:
    """Every stride equal, size-1 dims included, without guarding on a symbolic one."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true  # (imported here: see _no_meta)

    return all(statically_known_true(a == b) for a, b in zip(r.stride(), o.stride()))


def _same_view(r, o) -> bool:
    return r.storage_offset() == o.storage_offset() and (o.numel() <= 1 or same_strides(r, o))


def finish_outputs(func, emitter, fargs, fkwargs, flat_out, ref, fixups, finals=None):
    """Check outputs against eager's metadata and aliasing; return the graph's output nodes.

    ``finals``, a list, receives each output as the kernel returns it (fake, after its fix-up).
    Fix-ups run through ``emitter``, so they run on the fakes too.
    """
    finals = [] if finals is None else finals
    schema = func._schema
    inputs = [t for t in flat_tensors(fargs, fkwargs)]
    in_storages = {_storage(t) for t in inputs}
    nodes = []
    for i, o in enumerate(flat_out):
        if not isinstance(o, torch.Tensor):
            nodes.append(emitter.value(o))  # a symbolic size becomes a graph value
            finals.append(o)
            continue
        emitter.node(o)  # every output must be a traced value
        r = ref.out(i) if ref is not None else None
        eager_shares = ref is not None and i < len(ref.shares) and ref.shares[i]
        if isinstance(r, torch.Tensor) and (r.dtype, r.shape, r.device) != (o.dtype, o.shape, o.device):
            raise MismatchError(
                f"{func}: output {i} of its decomposition is {o.dtype}{list(o.shape)} on {o.device}, "
                f"eager gives {r.dtype}{list(r.shape)} on {r.device}. This decomposition is wrong for "
                "these arguments: add the op to the opset or register a correct decomposition."
            )
        alias = _return_alias(schema, i)
        if alias is not None:
            name, is_write = alias
            src = _arg_by_name(schema, fargs, fkwargs, name)
            if is_write and o is not src:
                raise MismatchError(
                    f"{func}: its decomposition does not return the mutated input {name!r}, as eager does"
                )
            if is_write and resizes_like_functional(func) and isinstance(r, torch.Tensor):
                if o.numel() > 1 and not _same_view(r, o):
                    # NOTE: an out= tensor that eager resized takes the strides its kernel computes
                    # (a column-major input gives a column-major out): written again in that layout
                    o = _restride_written(emitter, o, r)
                    fixups.append("restride out")
                elif not _surely_same_strides(r, o):
                    # only strides no element is reached through differ (dims of size 1):
                    # eager's, with nothing moved
                    o = emitter(aten.as_strided_.default, (o, list(r.shape), list(r.stride()), r.storage_offset()), {})
                    fixups.append("out strides")
            if not is_write and isinstance(src, torch.Tensor):
                if o is src and func not in IDENTITY_OPS:
                    o, _ = emitter(aten.alias.default, (o,), {}), fixups.append("alias")
                # NOTE: an alias annotation says "may alias": to.dtype returns self when nothing
                # changes and a copy otherwise, so a copy is wrong only where eager's shares.
                elif _storage(o) != _storage(src) and (ref is None or eager_shares):
                    raise MismatchError(
                        f"{func}: its decomposition returns a copy where eager returns a view of {name!r}"
                    )
        elif _storage(o) in in_storages:
            if not eager_shares:
                o, _ = emitter(aten.clone.default, (o,), {}), fixups.append("clone")
            elif isinstance(r, torch.Tensor) and not _same_view(r, o):
                raise MismatchError(
                    f"{func}: output {i} of its decomposition is a view with strides {o.stride()} at offset "
                    f"{o.storage_offset()}, eager's has {r.stride()} at {r.storage_offset()}; register a correct "
                    "decomposition or add the op to the opset"
                )
        elif eager_shares:
            raise MismatchError(
                f"{func}: output {i} of its decomposition is a copy where eager returns a view of an input"
            )
        elif isinstance(r, torch.Tensor) and o.numel() > 1 and not same_strides(r, o):
            with emitter.fake_mode:
                fresh = emitter(
                    aten.empty_strided.default,
                    (list(r.shape), list(r.stride())),
                    {"dtype": r.dtype, "device": r.device},
                )
            o, _ = emitter(aten.copy_.default, (fresh, o), {}), fixups.append("restride")
        nodes.append(emitter.node(o))
        finals.append(o)
    return nodes


def _restride_written(emitter, o, r):
    """``o`` (a written input, already holding the result) given ``r``'s strides, values kept."""
    values = emitter(aten.clone.default, (o,), {})
    o = emitter(aten.as_strided_.default, (o, list(r.shape), list(r.stride()), r.storage_offset()), {})
    return emitter(aten.copy_.default, (o, values), {})


def layout_matters(func) -> bool:
    """Whether the bypass path must check ``func``'s results against eager's layout: a
    functional op's fresh outputs, and an out= resized as the functional op's result."""
    schema = func._schema
    functional = not schema.is_mutable and not any(r.alias_info is not None for r in schema.returns)
    return (functional or resizes_like_functional(func)) and returns_tensor(func)


def relayout(func, args, kwargs, out, ref, run=None):
    """On the bypass path (after :func:`unalias`): each output given eager's strides where
    the decomposition's differ, as :func:`finish_outputs` does when tracing. ``ref`` is
    :func:`reference` taken before the call (an out= is resized by it); None: no meta kernel.
    ``run(op, args, kwargs)`` runs each fix-up op (the call's lowering, so they stay in its opset)."""
    run = run or _call
    if ref is None:
        return out
    written = {id(t) for t in flat_tensors((), {k: v for k, v in kwargs.items() if k in out_args(func)})}
    flat, spec = tree_flatten(out)
    for i, o in enumerate(flat):
        r = ref.out(i)
        if not (isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor)) or o.layout != torch.strided:
            continue
        if o.shape != r.shape or o.numel() <= 1:
            continue
        if id(o) in written:  # a resized out=: rewritten in place at eager's strides
            if not _same_view(r, o):
                values = run(aten.clone.default, (o,), {})
                run(aten.as_strided_.default, (o, list(r.shape), list(r.stride()), r.storage_offset()), {})
                run(aten.copy_.default, (o, values), {})
            elif o.stride() != r.stride():  # only size-1 dims differ: metadata alone
                run(aten.as_strided_.default, (o, list(r.shape), list(r.stride()), r.storage_offset()), {})
        elif not same_strides(r, o) and not (
            i < len(ref.shares) and ref.shares[i]
        ):  # (eager's views are not ours to move)
            where = {"dtype": o.dtype, "device": o.device}
            fresh = run(aten.empty_strided.default, (list(r.shape), list(r.stride())), where)
            flat[i] = run(aten.copy_.default, (fresh, o), {})
    return tree_unflatten(flat, spec)


def unalias(func, args, kwargs, out, run=None):
    """On the bypass path (no kernel): a functional op's outputs that share memory with an
    input are cloned, as :func:`finish_outputs` does when tracing.

    ``run``: as :func:`relayout`'s.

    NOTE: judged by the schema alone, so an op that returns views without saying so
    (unsafe_split) would be cloned here; such ops trace, and never take this path.
    """
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return out
    flat, spec = tree_flatten(out)
    inputs = {_storage(t) for t in flat_tensors(args, kwargs) if t.layout == torch.strided}
    if not any(isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in inputs for o in flat):
        return out
    flat = [
        (run or _call)(aten.clone.default, (o,), {})
        if isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in inputs
        else o
        for o in flat
    ]
    return tree_unflatten(flat, spec)
