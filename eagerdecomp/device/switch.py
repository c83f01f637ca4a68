"""The device switch: every op a device has no kernel for goes through eagerdecomp.

:func:`enable` registers one boxed fallback on the device's dispatch key: the C++ hit path's
(``csrc/hit.cpp``, :mod:`eagerdecomp.runtime.hits`), which serves calls whose key has a program with no
Python, and calls the Python kernel below on a miss; a Python fallback on the pure-Python path.
The dispatcher calls it only for ops with no kernel of any kind for that key
(a device kernel, or PyTorch's composite kernels, run first), after autograd
has recorded the op, so backward ops take the same path. The fallback hands
the call to a :class:`~eagerdecomp.runtime.Runtime`: decomposition traced once
over fake tensors, cached, replayed on the real tensors, whose ops dispatch
back to the device's own kernels.

The target opset defaults to the ops with a kernel for the device's key, read
from the dispatcher, so decomposition stops exactly where the device's kernels
begin. An explicit opset narrows that; it may not claim an op the device lacks.

PyTorch's composite kernels (CompositeExplicitAutograd[NonFunctional]) serve every
backend key and so would run before any fallback: ``silu`` would reach us as
``silu.out``, ``x[idx] = 0`` as the internal ``_index_put_impl_``, which has no
decomposition. So :func:`enable` also registers the same Python kernel on the
device's key for each such op outside the opset that the decomposition table
covers: the device then meets the ops a user called, exactly as
:class:`~eagerdecomp.EagerDecompMode` does. Composite ops without a decomposition
keep PyTorch's composite kernel.

Example::

    >>> import torch
    >>> from eagerdecomp import device
    >>> from eagerdecomp.testing import reference_device
    >>> dev = reference_device()                     # a strict core-ATen-only device
    >>> _ = device.enable(dev.type)
    >>> y = torch.nn.functional.silu(torch.randn(4).to(dev))   # silu is not core: decomposed
    >>> device.enabled(dev).report().row(torch.ops.aten.silu.default).route
    'decomposed'
    >>> device.disable(dev.type)
    True

With ``on_unsupported="cpu"`` an op with no path to the device's kernels runs on the CPU
instead of raising: the CPU tier (:mod:`eagerdecomp.runtime.host`), exact or refused with a
clear error, and on the record.

Deployments that cannot change code set ``EAGERDECOMP_DEVICES=mydevice`` (comma
separated, ``name=opset`` to pick a preset, ``name:cpu`` for the CPU tier) and
:func:`enable_from_env` runs at import.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch._C import DispatchKey

from eagerdecomp.errors import BackendError
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.ops.schema import op_from_name, op_names, returns_tensor
from eagerdecomp.runtime import hits
from eagerdecomp.runtime.core import Runtime, runtime_for
from eagerdecomp.runtime.routes import device_refusal
from eagerdecomp.runtime.stats import Route

__all__ = ["enable", "disable", "enabled", "device_opset", "enable_from_env", "DISPATCH_KEYS", "DeviceSwitch"]

# Device type -> the dispatch key its kernels live under. PrivateUse1 is looked up under
# its current name too (rename_privateuse1_backend). Add a row to support another key.
DISPATCH_KEYS = {
    "privateuseone": "PrivateUse1",
}


@dataclass
class DeviceSwitch:
    """One enabled device: its key, the runtime its fallback calls, and the registration."""

    device: str
    key: str
    runtime: Runtime
    settings: tuple
    library: object  # the fallback: a torch.library.Library, or the C++ registration (eagerdecomp.runtime.hits)
    composites: object  # the composite ops taken over (see the module docstring), or None with the C++ one
    device_ops: OpSet  # the device's own kernels, read before enabling

    @property
    def kept_composite(self) -> Counter:
        """Calls of taken-over ops that had no path and ran PyTorch's composite kernel, per op."""
        out: Counter = Counter()
        for (op, route, _, _), n in self.runtime.stats.counts().items():
            if route is Route.COMPOSITE:
                out[op] += n
        return out

    def report(self):
        """Per-op :class:`~eagerdecomp.stats.Report` of everything the fallback saw."""
        return self.runtime.stats.report()


_lock = threading.Lock()
_enabled: dict = {}  # dispatch key -> DeviceSwitch


def _device_type(device) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise BackendError(
            f"unknown device {device!r}: torch does not know it ({e}). Load the device's extension "
            "(which registers its name) before enabling eagerdecomp for it."
        ) from None


def _dispatch_key(device_type: str) -> str:
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    key = DISPATCH_KEYS.get(device_type)
    if key is None:
        supported = sorted({torch._C._get_privateuse1_backend_name(), *DISPATCH_KEYS})
        raise BackendError(
            f"device type {device_type!r} has no dispatch key eagerdecomp can take over; expected one of "
            f"{supported}. Built-in devices (cpu, cuda, ...) already run every op; a new device registers "
            "as PrivateUse1 (torch.utils.rename_privateuse1_backend), or add a row to eagerdecomp.device.DISPATCH_KEYS."
        )
    return key


@functools.cache
def _overloads(name: str):
    op = op_from_name(name if "." in name.partition("::")[2] else name + ".default")
    return op if isinstance(op, torch._ops.OpOverload) else None


def device_opset(device) -> OpSet:
    """The ops with a kernel registered for ``device``'s dispatch key, read from the dispatcher
    (eagerdecomp's own registrations excluded while the device is enabled)."""
    device_type = _device_type(device)
    key = _dispatch_key(device_type)
    if key in _enabled:
        return _enabled[key].device_ops
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    ops = [_overloads(n) for n in op_names() if has(n, key)]
    return OpSet([op for op in ops if op is not None], name=f"{device_type} kernels")


def _without_autograd(ops, key: str) -> list:
    """Ops the device has a kernel for that PyTorch decomposes above autograd everywhere else.

    NOTE: a CompositeImplicitAutograd op (``upsample_bilinear2d.vec``, ``var.dim``...) gets its
    gradient from the ops its composite calls. A kernel on the device's key replaces the
    composite there, autograd included, and PyTorch's autograd fallback then drops the
    gradient (with a warning). Nothing eagerdecomp does runs for such a call.
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(
        str(op)
        for op in ops
        if has(op.name(), "CompositeImplicitAutograd")
        and returns_tensor(op)  # sizes, bools (_has_compatible_shallow_copy_type): no gradient
        and not has(op.name(), f"Autograd{key}")
    )


def _runnable(op, key: str) -> bool:
    """Whether the device itself runs ``op``: a kernel on its key, or a CompositeImplicitAutograd
    kernel (expanded above autograd, the op never reaches a backend).

    NOTE: a CompositeExplicitAutograd kernel does not count. It runs on any key by calling
    other ops, so an opset op served only by one would reach the device as ops it may not
    speak: every prims op has one (calling aten ops), and ``enable(edref, "prims")`` passed
    while edref, with no prims kernel, received ``silu`` as ``aten.exp``, ``aten.div``...
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(op.name(), key) or has(op.name(), "CompositeImplicitAutograd")


# Fallback calls nested in one thread (a composite kernel run by a replayed kernel may meet
# the fallback again); past this depth it is a cycle between the opset and the device.
MAX_NESTING = 32
_tls = threading.local()


def _fallback_for(runtime: Runtime, device_type: str):
    ops = runtime.ops

    def fallback(op, *args, **kwargs):
        # NOTE: an opset op reaching the fallback means the device lacks its kernel; passing
        # it through would call it again and land here forever. enable() checks this up front.
        if op in ops:
            raise BackendError(
                f"{op}: in the target opset but {device_type!r} has no kernel for it; expected every "
                "opset op to run on the device. Register its kernel or leave it out of the opset."
            )
        refusal = device_refusal(op, device_type, runtime.table)  # a collective or a custom op with no path
        if refusal is not None:
            raise refusal
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        if len(stack) >= MAX_NESTING:
            chain = " -> ".join(map(str, stack[-6:] + [op]))
            raise BackendError(
                f"{op}: the device switch for {device_type!r} re-entered itself {MAX_NESTING} times (... {chain}); "
                "expected decompositions to reach the device's kernels. An opset op's composite kernel "
                "probably calls an op whose decomposition calls it back: leave that op out of the opset."
            )
        stack.append(op)
        try:
            return runtime(op, *_as_given(op, args, kwargs))
        finally:
            stack.pop()

    return fallback


@functools.cache
def _defaults(op) -> tuple:
    """Positional defaults (index, value) and the keyword-only arguments that are None by default."""
    schema = op._schema.arguments
    positional = tuple((i, a.default_value) for i, a in enumerate(schema) if not a.kwarg_only and a.has_default_value())
    none_kw = frozenset(a.name for a in schema if a.kwarg_only and a.has_default_value() and a.default_value is None)
    return positional, none_kw


def _as_given(op, args: tuple, kwargs: dict):
    """``(args, kwargs)`` without the trailing arguments that only repeat their defaults.

    NOTE: a call from torch.library's Python fallback (no C++ library) spells out every argument
    (``add_.Scalar(x, 1e-8, 1)``, ``layout=None``), a call from Python only those given; the same
    call either way (the C++ library's fallback hands calls over as Python's would). The refs a
    prims opset decomposes with refuse some of them (``torch._refs.add`` takes ``alpha`` by
    keyword only; ``scalar_tensor(..., layout=None)``: "PrimTorch doesn't support layout=None"),
    so the device's calls arrive as Python's would.
    """
    positional, none_kw = _defaults(op)
    if positional:
        defaults = dict(positional)
        n = len(args)
        while n and n - 1 in defaults and _same_default(args[n - 1], defaults[n - 1]):
            n -= 1
        args = args[:n]
    if none_kw and any(kwargs.get(k, 0) is None for k in none_kw):
        kwargs = {k: v for k, v in kwargs.items() if not (v is None and k in none_kw)}
    return args, kwargs


def _same_default(value, default) -> bool:
    # NOTE: by type too: 1.0 is not the default 1 of an int argument (it promotes differently)
    return type(value) is type(default) and value == default


def enable(
    device,
    opset: str | OpSet | Iterable | None = None,
    *,
    decompositions: Mapping | None = None,
    on_unsupported: str = "error",
    compile=None,
) -> DeviceSwitch:
    """Decompose, on ``device``, every op it has no kernel for; return the :class:`DeviceSwitch`.

    Args:
        device: a device type or ``torch.device`` whose backend registered its kernels
            (``"edref"``, ``torch.device("mydev", 0)``).
        opset: where decompositions stop. None (default): the ops the device has kernels
            for (:func:`device_opset`). A preset name, :class:`OpSet` or iterable narrows it;
            an op in it that the device cannot run raises :class:`BackendError`.
        decompositions: extra ``{op: fn}`` entries, as for :class:`~eagerdecomp.EagerDecompMode`.
        on_unsupported: an op the device lacks and eagerdecomp cannot decompose (nor run
            with PyTorch's composite kernel): ``"error"`` raises
            :class:`~eagerdecomp.errors.UnsupportedOpError`; ``"cpu"`` runs the CPU's kernel on
            host copies and copies the results back (:mod:`eagerdecomp.runtime.host`: views
            and random ops without the device's generator are still refused).
        compile: as for :class:`~eagerdecomp.EagerDecompMode`: None, ``"inductor"`` (for a
            device Inductor generates code for) or the device team's own graph compiler.

    Enabling a device twice with the same arguments is a no-op; with other arguments it
    raises :class:`BackendError` (call :func:`disable` first).
    """
    device_type = _device_type(device)
    key = _dispatch_key(device_type)
    if on_unsupported not in ("error", "cpu"):
        raise BackendError(
            f"enable({device_type!r}): on_unsupported={on_unsupported!r} is not available for a device; "
            "expected 'error' or 'cpu'. An op that reaches the device switch has no kernel on the device to "
            "fall through to: register a decomposition for it, or let it run on the CPU with 'cpu'."
        )
    if compile == "inductor" and not _inductor_supports(device_type):
        raise BackendError(
            f"enable({device_type!r}, compile='inductor'): Inductor generates no code for this device; "
            "expected a device with an Inductor backend (cpu, cuda, xpu, ...). Pass your own graph "
            "compiler as compile=fn(graph_module, example_inputs), or compile=None to replay."
        )
    settings = (
        opset if isinstance(opset, (str, type(None))) else OpSet.coerce(opset),
        tuple(sorted((str(k), id(v)) for k, v in (decompositions or {}).items())),
        compile,
        on_unsupported,
    )
    with _lock:
        current = _enabled.get(key)
        if current is not None:
            if current.settings == settings and current.device == device_type:
                return current
            raise BackendError(
                f"enable({device_type!r}): already enabled with other settings; call "
                f"eagerdecomp.disable({device_type!r}) first"
            )
        have = device_opset(device_type)
        lost = _without_autograd(have, key)
        if lost:
            warnings.warn(
                f"enable({device_type!r}): the device registers kernels for {len(lost)} op(s) whose gradient "
                f"comes from a CompositeImplicitAutograd kernel: {', '.join(lost)}. Its kernel replaces that "
                "composite, so autograd through these ops on the device has no gradient. Expected no device "
                "kernel for them: remove those registrations (eagerdecomp then runs the ops they call).",
                RuntimeWarning,
                stacklevel=2,
            )
        if opset is None:
            target = have
        else:
            target = OpSet.coerce(opset)
            missing = sorted(str(op) for op in target if not _runnable(op, key))
            if missing:
                shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
                raise BackendError(
                    f"enable({device_type!r}): the opset {target.name or 'given'} claims {len(missing)} op(s) the "
                    f"device has no kernel for: {shown}. Expected every opset op to have a kernel on the device's "
                    f"{key} key (a composite kernel does not count: it runs the op as other ops). Pass opset=None "
                    f"to use the device's own kernels ({len(have)} ops), narrow the opset, or register the "
                    "missing kernels first (a prims backend registers its prims:: kernels on its key)."
                )
        runtime = runtime_for(target, decompositions, on_unsupported, compile)
        kernel = _fallback_for(runtime, device_type)
        taken = _composites_to_take_over(runtime, have)
        for op, composite_key in taken:
            # with no path to the opset, the runtime runs this composite (Route.COMPOSITE)
            runtime.composites[op] = composite_key
        if runtime.hits is not None:
            # NOTE: the C++ fallback serves hits with no Python and no GIL; a miss calls the
            # same Python kernel, which hands back the key's program (eagerdecomp.runtime.hits)
            from eagerdecomp.runtime.library import load

            runtime.serves_device = True
            names = [_impl_name(op) for op, _ in taken]
            host = runtime.host.token if runtime.host is not None else 0
            library = load().hit.Registration(
                runtime.hits, runtime.hit_counts, _miss_handler(runtime, kernel), key, names, hits.saver(runtime), host
            )
            composites = None
        else:
            library = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a fallback needs the global namespace
            library.fallback(kernel, key)
            composites = torch.library.Library("aten", "IMPL")  # noqa: TOR901
            for op, _ in taken:
                composites.impl(op, _take_over(kernel, op), key)
        switch = _enabled[key] = DeviceSwitch(device_type, key, runtime, settings, library, composites, have)
        return switch


def _inductor_supports(device_type: str) -> bool:
    from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration

    init_backend_registration()
    return get_scheduling_for_device(device_type) is not None


def _impl_name(op) -> str:
    schema = op._schema
    return schema.name.partition("::")[2] + (f".{schema.overload_name}" if schema.overload_name else "")


@functools.cache
def _op(name: str, overload: str):
    ns, _, base = name.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def _miss_handler(runtime: Runtime, kernel):
    """What the C++ fallback calls on a miss: ``(out, program or None)``; the program, offered
    by the runtime for this call's key, is installed by C++ for the next call."""
    tls = runtime._tls

    def handler(name, overload, args, kwargs):
        prev = getattr(tls, "offer", None)
        tls.offer = None  # a nested miss (a composite replayed below) restores ours when it ends
        try:
            out = kernel(_op(name, overload), *args, **kwargs)
            return out, tls.offer
        finally:
            tls.offer = prev

    return handler


def _take_over(kernel, op):
    def take_over(*args, **kwargs):
        return kernel(op, *args, **kwargs)

    return take_over


# NOTE: these keep PyTorch's composite kernel. C++ wraps their results in new Python
# objects (Parameter(), Tensor._make_subclass, fake tensor conversion detach first), and a
# tensor returned by a Python kernel already has one: "raw Tensor object is already associated".
_KEEP_COMPOSITE = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default}
_TAKEN_OVER_KEYS = (DispatchKey.CompositeExplicitAutogradNonFunctional, DispatchKey.CompositeExplicitAutograd)


def _composites_to_take_over(runtime: Runtime, have: OpSet) -> list:
    """``(op, composite key)`` for each op outside the opset that a composite kernel would
    run on the device and that the decomposition table covers (precedence as the dispatcher's)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = []
    for op in runtime.table:
        if op in runtime.ops or op in have or op.namespace != "aten" or op in _KEEP_COMPOSITE:
            continue
        if op.__name__.startswith("_foreach_"):
            # NOTE: their composite loops over the list calling per-tensor ops (taken over or
            # the device's own); taken over whole, a list of per-parameter floats (AdamW's step
            # sizes) is keyed by value and retraced every step, and _foreach_mul has no path.
            continue
        # NOTE: some overloads torch exposes have no dispatcher entry under their name
        # (_index_put_impl_.hacked_twin): nothing to take over there
        for dk in _TAKEN_OVER_KEYS:
            try:
                found = has(op.name(), dk.name)
            except RuntimeError:
                break
            if found:
                out.append((op, dk))
                break
    return out


def disable(device) -> bool:
    """Remove eagerdecomp's fallback from ``device``; True if it was enabled, False (no-op) if not."""
    key = _dispatch_key(_device_type(device))
    with _lock:
        switch = _enabled.pop(key, None)
    if switch is None:
        return False
    if switch.composites is None:  # the C++ registration
        switch.library.remove()
    else:
        switch.composites._destroy()
        switch.library._destroy()
    return True


def enabled(device=None):
    """The :class:`DeviceSwitch` for ``device`` (None if not enabled), or all enabled device types."""
    if device is None:
        return sorted(b.device for b in _enabled.values())
    return _enabled.get(_dispatch_key(_device_type(device)))


def enable_from_env(value: str | None = None) -> list:
    """Enable each device named in ``EAGERDECOMP_DEVICES`` (``"dev1,dev2=core_aten,dev3:cpu"``;
    ``:cpu`` turns on the CPU tier, ``on_unsupported="cpu"``).

    ``edref`` and ``edprims`` load that reference device first. Returns the enabled :class:`DeviceSwitch` objects.
    ``EAGERDECOMP_BACKENDS``, the variable's former name, is read too, with a DeprecationWarning.
    """
    if value is None:
        value = os.environ.get("EAGERDECOMP_DEVICES", "")
        if not value and os.environ.get("EAGERDECOMP_BACKENDS"):
            warnings.warn(
                "EAGERDECOMP_BACKENDS is deprecated; set EAGERDECOMP_DEVICES", DeprecationWarning, stacklevel=2
            )
            value = os.environ["EAGERDECOMP_BACKENDS"]
    out = []
    for item in filter(None, (s.strip() for s in value.split(","))):
        item, _, tier = item.partition(":")
        if tier not in ("", "cpu"):
            raise BackendError(f"EAGERDECOMP_DEVICES: {item}:{tier}: expected ':cpu' or nothing after the name")
        name, _, opset = item.partition("=")
        from eagerdecomp.device.refdev import REFERENCE_DEVICES, reference_device

        if name in REFERENCE_DEVICES:
            reference_device(name)
        out.append(enable(name, opset or None, on_unsupported="cpu" if tier else "error"))
    return out
