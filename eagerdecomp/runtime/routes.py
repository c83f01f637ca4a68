"""Ops outside ATen compute: which eagerdecomp leaves alone, which it runs itself, and why.

eagerdecomp decomposes ATen ops (``aten::``, ``prims::``) into an opset. Other
namespaces carry other work, and one table, :data:`NAMESPACES`, says what each
is and why it is routed as it is:

* **infrastructure** (``prim::``, ``profiler::``): compute nothing; they pass
  through as they are and are never recorded into a kernel.
* **communication** (``c10d::``, ``_c10d_functional::``, ``_dtensor::`` ...):
  process-group work (DDP's allreduce, DTensor's and FSDP2's functional
  collectives). The process group's backend runs them; they pass through the
  mode untouched and are never decomposed. On the device switch one reaches
  eagerdecomp only when the device's process-group backend lacks it: a
  :class:`~eagerdecomp.errors.BackendError` names it and what to register.

Every other namespace holds **custom ops** (``torch.library.custom_op``,
``triton_op``, C++ ``TORCH_LIBRARY``), routed by :func:`custom_route`:

1. a registered decomposition (``eagerdecomp.register_decomposition``, a
   per-mode ``decompositions=`` entry, or ``torch._decomp``'s table) is used,
   as for any ATen op;
2. a CompositeImplicitAutograd kernel is a decomposition already (the lowering
   calls it, so the ATen ops inside are decomposed and the kernel cached);
3. a kernel registered from Python (``custom_op``, ``triton_op``,
   ``Library.impl``) is run *under* eagerdecomp: the ATen ops it calls come back
   to the runtime, each decomposed and cached like any other call
   (:data:`CUSTOM_IMPL`). It is not traced as a whole: a Python body may launch
   kernels (Triton) or keep state that a replayed graph would skip;
4. anything else is an opaque kernel the user owns: it passes through, and the
   report counts it under its own route (:data:`CUSTOM_KERNEL`).

No ``torch.Tag`` marks collectives or custom ops in torch 2.13 (c10d ops carry
none, the functional ones only ``pt2_compliant_tag``), so the table is by namespace.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch._C import DispatchKey
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode

from eagerdecomp.errors import BackendError

__all__ = [
    "Rule",
    "NAMESPACES",
    "INFRASTRUCTURE",
    "COMMUNICATION",
    "CUSTOM_IMPL",
    "CUSTOM_KERNEL",
    "custom_route",
    "is_infrastructure",
    "infrastructure_ops",
    "is_communication",
    "passes_through",
    "python_kernel_key",
    "run_under",
    "defers_to_subclass",
    "handler",
    "implementation",
    "device_refusal",
]

INFRASTRUCTURE = "infrastructure"
COMMUNICATION = "communication"
CUSTOM_IMPL = "custom op"  # its Python implementation runs under eagerdecomp
CUSTOM_KERNEL = "custom kernel"  # an opaque kernel: passes through


class Rule(NamedTuple):
    name: str
    reason: str


# Namespace -> route. ATen compute (aten::, prims::) is routed by the opset and the
# decomposition table, never here.
NAMESPACES = {
    "prim": Rule(INFRASTRUCTURE, "TorchScript metadata queries (prim::device, prim::dtype) made by decompositions"),
    "profiler": Rule(
        INFRASTRUCTURE, "torch.profiler bookkeeping (record_function enter/exit), e.g. around optimizer steps"
    ),
    "c10d": Rule(
        COMMUNICATION,
        "process-group collectives (dist.all_reduce, DDP's bucket allreduce and broadcast): "
        "the process group's backend runs them",
    ),
    "_c10d_functional": Rule(COMMUNICATION, "functional collectives and wait_tensor (DTensor, FSDP2, compiled graphs)"),
    "_c10d_functional_autograd": Rule(COMMUNICATION, "differentiable functional collectives"),
    "c10d_functional": Rule(COMMUNICATION, "the functional collectives' legacy namespace (still registered)"),
    "_dtensor": Rule(COMMUNICATION, "DTensor's own collectives (shard_dim_alltoall)"),
    "symm_mem": Rule(COMMUNICATION, "symmetric-memory collectives and their rendezvous"),
}

COMPUTE_NAMESPACES = frozenset({"aten", "prims"})

_CUSTOM_IMPL_ROUTE = Rule(CUSTOM_IMPL, "a custom op with a Python implementation: runs under eagerdecomp")
_CUSTOM_KERNEL_ROUTE = Rule(CUSTOM_KERNEL, "a custom op with only an opaque kernel: passes through to it")


def is_infrastructure(func) -> bool:
    """True for ops of an infrastructure namespace (``prim::``, ``profiler::``)."""
    route = NAMESPACES.get(func.namespace)
    return route is not None and route.name == INFRASTRUCTURE


@functools.cache
def infrastructure_ops() -> tuple:
    """The registered ops of the infrastructure namespaces (record_function's enter and exit):
    the mode's C++ key passes them below as it does opset ops, never entering Python.

    NOTE: asked once per process: listing every op name costs ~2.4 ms, and a mode made per step
    makes its C++ state per entry; these namespaces are PyTorch's own, registered at import."""
    prefixes = tuple(f"{ns}::" for ns, rule in NAMESPACES.items() if rule.name == INFRASTRUCTURE)
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith(prefixes):
            ns, _, rest = name.partition("::")
            base, _, overload = rest.partition(".")
            out.append(getattr(getattr(getattr(torch.ops, ns), base), overload or "default"))
    return tuple(out)


def is_communication(func) -> bool:
    """True for collectives (``c10d::``, ``_c10d_functional::``, ``_dtensor::`` ...)."""
    route = NAMESPACES.get(func.namespace)
    return route is not None and route.name == COMMUNICATION


def _has(func, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)


def python_kernel_key(func, device_type: str = "cpu") -> str | None:
    """The dispatch key of ``func``'s kernel for ``device_type`` when it was registered from
    Python (``custom_op``, ``triton_op``, ``Library.impl``), else None.

    NOTE: ``torch.library`` records every Python registration as ``ns/name/key`` (that is how
    it refuses a second one); a C++ kernel never appears there.
    """
    from torch.library import _impls

    ns, _, rest = func.name().partition("::")
    names = (rest, f"{rest}.{func._overloadname}")
    backend = torch._C._dispatch_key_for_device(device_type)
    for key in (backend, "CompositeExplicitAutograd"):  # the dispatcher's precedence
        if any(f"{ns}/{n}/{key}" in _impls for n in names):
            return key
        if _has(func, key):
            return None  # a C++ kernel serves this key first
    return None


def custom_route(func, table) -> Rule | None:
    """How to run ``func``, an op outside ATen and outside the opset: its :data:`NAMESPACES`
    route, or for a custom op :data:`CUSTOM_IMPL` / :data:`CUSTOM_KERNEL`; None when the
    usual decomposition applies (a table entry or a CompositeImplicitAutograd kernel)."""
    route = NAMESPACES.get(func.namespace)
    if route is not None or func.namespace in COMPUTE_NAMESPACES or not isinstance(func, OpOverload):
        return route  # (higher-order operators are not ops of the dispatcher: left to the usual path)
    if func in table or _has(func, "CompositeImplicitAutograd"):
        return None
    if _python_anywhere(func):
        return _CUSTOM_IMPL_ROUTE
    return _CUSTOM_KERNEL_ROUTE


def _python_anywhere(func) -> bool:
    from torch.library import _impls

    ns, _, rest = func.name().partition("::")
    prefixes = (f"{ns}/{rest}/", f"{ns}/{rest}.{func._overloadname}/")
    skip = ("Meta", "Autograd", "BackendSelect", "Functionalize", "ADInplaceOrView", "Fake")
    return any(k.startswith(prefixes) and not k.rpartition("/")[2].startswith(skip) for k in _impls)


def passes_through(func, table=None) -> bool:
    """True for ops eagerdecomp hands on untouched: infrastructure, communication, and
    custom ops with only an opaque kernel (``table``: the decompositions that would apply)."""
    route = custom_route(func, {} if table is None else table)
    return route is not None and route.name != CUSTOM_IMPL


def _device_type(args, kwargs) -> str:
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x.device.type
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, torch.Tensor):
                    return y.device.type
    return "cpu"


def defers_to_subclass(types) -> bool:
    """True when a call's tensor types include a subclass with its own ``__torch_dispatch__``
    (DTensor): a mode returns NotImplemented so the subclass runs first, and the plain-tensor
    ops it runs come back to the mode. (``types`` may hold plain ``torch.Tensor`` too.)"""
    # NOTE: asked on every call the mode sees, pass-through included: remembered per types
    # tuple (a few distinct ones in a program; forgotten when many, so classes are not held)
    known = _DEFERS.get(types)
    if known is None:
        if len(_DEFERS) >= 256:
            _DEFERS.clear()
        known = _DEFERS[types] = any(
            t.__torch_dispatch__ is not _NO_DISPATCH and not issubclass(t, _MODE_TENSORS) for t in types
        )
    return known


_DEFERS: dict = {}


_NO_DISPATCH = torch.Tensor.__torch_dispatch__  # torch._C._disabled_torch_dispatch_impl
# NOTE: fake and functional tensors belong to an infrastructure mode that sits below every user
# mode (FakeTensorMode, FunctionalTensorMode): their ops reach it through us, and the tensor
# class itself refuses while its mode is active (DTensor's sharding propagation runs ops on
# fakes under FakeTensorMode). They are handled like plain tensors.
_MODE_TENSORS = (FakeTensor, FunctionalTensor)


class _Within(TorchDispatchMode):
    """Sends every op called inside a custom op's implementation back to ``runtime``."""

    def __init__(self, runtime):
        super().__init__()
        self.runtime = runtime

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defers_to_subclass(types):  # the subclass first; its inner ops come back here
            return NotImplemented
        return self.runtime(func, args, kwargs or {})


def run_under(runtime, func, args, kwargs):
    """Run custom op ``func``: its Python kernel for the arguments' device with every op it
    calls routed through ``runtime``; without one, its own (opaque) kernel as it is.

    Returns ``(route name, result)``.
    """
    key = python_kernel_key(func, _device_type(args, kwargs))
    if key is None:
        return CUSTOM_KERNEL, func(*args, **kwargs)
    with _Within(runtime):
        return CUSTOM_IMPL, func._op_dk(getattr(DispatchKey, key), *args, **kwargs)


def handler(runtime, route: Rule):
    """The function ``runtime`` calls for ops of ``route`` (``Runtime._route_for`` asks)."""
    from eagerdecomp.runtime.stats import Route as Route_  # the report's routes (stats imports nothing of ours)

    if route.name == INFRASTRUCTURE:
        return runtime.passthrough
    record = runtime.stats.record
    if route.name == COMMUNICATION:

        def communicate(func, args, kwargs):
            record(func, Route_.COMMUNICATION)
            return func(*args, **kwargs)

        return communicate

    def custom(func, args, kwargs):
        name, out = run_under(runtime, func, args, kwargs)
        record(func, Route_(name))
        return out

    return custom


def implementation(func, args, kwargs):
    """For a custom op whose kernel for the arguments' device was registered from Python, a
    function running that kernel (the lowering's decomposition of it); else None."""
    if func.namespace in COMPUTE_NAMESPACES or func.namespace in NAMESPACES:
        return None
    key = python_kernel_key(func, _device_type(args, kwargs))
    if key is None:
        return None
    return functools.partial(func._op_dk, getattr(DispatchKey, key))


def device_refusal(func, device_type: str, table) -> BackendError | None:
    """The error for ``func`` reaching the device switch of ``device_type`` when eagerdecomp
    cannot run it there, or None.

    NOTE: the switch is reached only by ops with no kernel for the device and no composite
    one, so a collective there is one the device's process-group backend lacks, and a custom
    op without a decomposition has nothing that could run it: passed on, either would come
    straight back to the switch.
    """
    if is_communication(func):
        return BackendError(
            f"{func}: a collective on {device_type!r} tensors reached the device switch, so the device's "
            f"process-group backend lacks it; expected the process group to run it. Register a backend "
            f"for the device with torch.distributed.Backend.register_backend(name, creator, "
            f"devices=[{device_type!r}]) that implements it (eagerdecomp.refdev_dist is an example), "
            f"and name it in init_process_group."
        )
    route = custom_route(func, table)
    if route is not None and route.name in (CUSTOM_IMPL, CUSTOM_KERNEL):
        return BackendError(_custom_message(str(func), device_type))
    return None


def _custom_message(name: str, device_type: str) -> str:
    return (
        f"{name}: a custom op with no kernel for {device_type!r} and no Python or composite "
        f"implementation eagerdecomp could run; expected one of them. Register a kernel for the device "
        f"(torch.library.register_kernel / TORCH_LIBRARY_IMPL), a Python implementation, or a "
        f"decomposition with eagerdecomp.register_decomposition."
    )
