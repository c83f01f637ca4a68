"""The reference devices: ``edref`` (strict core ATen) and its twin ``edprims`` (strict prims).

A PrivateUse1 backend (``csrc/refdev.cpp``) whose memory is host memory and
which has a kernel for exactly :func:`device_ops`: for ``edref`` the ops tagged
``torch.Tag.core``, :data:`eagerdecomp.ops.opset.RUNTIME_EXTRAS`, and
:data:`DEVICE_RUNTIME_OPS` (what a device needs to exist); for ``edprims`` the
``prims_fusion`` preset (every ``prims::`` op and the library ops a fusion
compiler keeps), the same runtime ops and :data:`PRIMS_DEVICE_RUNTIME_OPS`. Each
kernel runs the CPU kernel (for a prims op, its aten implementation) on the same
memory. Every other op fails with PyTorch's own ``NotImplementedError`` ("Could
not run 'aten::silu.out' with arguments from the 'edref' backend"), until
:func:`eagerdecomp.enable` routes it through eagerdecomp.

PrivateUse1 is one dispatch key, so a process registers one of the two
(:data:`REFERENCE_DEVICES`); asking for the other is a :class:`BackendError`.

Loading has side effects (PrivateUse1 is renamed to ``edref`` and given an
allocator, a device guard and kernels), so it happens only when
:func:`reference_device` is called, never at ``import eagerdecomp``.

Example::

    >>> import torch
    >>> from eagerdecomp.device.refdev import reference_device, op_log
    >>> dev = reference_device()          # builds or loads csrc/ (cached)
    >>> x = torch.randn(4, device=dev)
    >>> with op_log() as ran:
    ...     y = (x * 2).cpu()
    >>> "mul.Tensor" in ran
    True
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
import types
from collections import Counter

import torch

from eagerdecomp.errors import BackendError
from eagerdecomp.ops.opset import RUNTIME_EXTRAS, OpSet
from eagerdecomp.runtime import library as _ext

__all__ = [
    "DEVICE_NAME",
    "PRIMS_DEVICE_NAME",
    "REFERENCE_DEVICES",
    "DEVICE_RUNTIME_OPS",
    "PRIMS_DEVICE_RUNTIME_OPS",
    "reference_device",
    "device_ops",
    "op_log",
    "is_loaded",
    "loaded_name",
]

DEVICE_NAME = "edref"
PRIMS_DEVICE_NAME = "edprims"

# Reference device -> the opset preset it has kernels for (beside the runtime ops below).
REFERENCE_DEVICES = {
    DEVICE_NAME: "core_aten",
    PRIMS_DEVICE_NAME: "prims_fusion",
}

# Ops beyond core ATen and RUNTIME_EXTRAS that a device needs in order to exist.
# NOTE: the core ops a device cannot do without are core already (empty.memory_format,
# empty_strided, as_strided, view, resize_, _local_scalar_dense, _to_copy); copy_ (in both
# directions between CPU and the device), as_strided_ and set_ (torch.load, copy.deepcopy) are
# RUNTIME_EXTRAS.
DEVICE_RUNTIME_OPS = {
    # NOTE: composite, but PyTorch asks each PrivateUse1 backend for its own answer (c10's
    # TensorImpl.h): without one, CPU and the device are incompatible, so Module.to(device)
    # gives every parameter a new Parameter instead of swapping its .data, and weights that
    # were tied (GPT-2's embedding and head) train as two. The kernel answers as CPU does.
    "aten::_has_compatible_shallow_copy_type": "Module.to() keeps tied weights tied (swaps .data in place)",
    # NOTE: a complex tensor's real and imaginary parts are a view of its storage at another
    # dtype; no core op changes a view's dtype, so a device with complex dtypes provides both
    # (real, imag, split and print of complex tensors all go through view_as_real).
    "aten::view_as_real": "complex storage viewed as (real, imag) pairs; no decomposition",
    "aten::view_as_complex": "(real, imag) pairs viewed as complex storage; no decomposition",
}

# NOTE: prims has ops to make tensors (prims.empty_strided), but PyTorch's C++ never calls
# them: it makes and moves a device's tensors with aten ops, which core ATen holds and prims
# does not. A prims device keeps these: the allocators and the copy every device needs, and
# what the demo, trained on the device with the switch, cannot do without (aten.as_strided and
# aten.view were tried and are not needed: the switch decomposes them into prims views).
PRIMS_DEVICE_RUNTIME_OPS = {
    "aten::empty.memory_format": "torch.empty / zeros / ones(device=...): every factory allocates through it",
    "aten::empty_strided": "tensors with given strides (empty_like of a strided tensor, autograd's buffers)",
    "aten::_to_copy": "Tensor.to(device) and .cpu(): moving data onto the device and back",
    # NOTE: prims that make a tensor from nothing (prims.full, prims.scalar_tensor, prims.iota...)
    # have a BackendSelect kernel, which runs before any backend's and calls the aten factory of
    # the same name on the device (whose composite kernel is aten.empty_strided + fill_). Their
    # own kernels are never reached, and decomposing those aten factories would call them back.
    "aten::fill_.Scalar": "factory prims fill their result with it (their BackendSelect kernel)",
    "aten::scalar_tensor": "prims.scalar_tensor's BackendSelect kernel calls it on the device",
    "aten::full": "prims.full's BackendSelect kernel calls it on the device",
    "aten::arange.start_step": "prims.iota's BackendSelect kernel calls it on the device",
    # NOTE: the same for the random prims: prims.normal's BackendSelect kernel is empty + normal_,
    # prims.uniform's empty_strided + uniform_. Without these, randn on the device (decomposed to
    # prims.normal) came back as normal_, whose decomposition is prims.normal: a cycle.
    "aten::normal_": "prims.normal's BackendSelect kernel fills its result with it (randn, nn.init.normal_)",
    "aten::uniform_": "prims.uniform's BackendSelect kernel fills its result with it",
}

# device name -> its runtime ops beyond DEVICE_RUNTIME_OPS
_RUNTIME_OPS = {DEVICE_NAME: {}, PRIMS_DEVICE_NAME: PRIMS_DEVICE_RUNTIME_OPS}

_lock = threading.Lock()
_loaded: str | None = None  # the reference device this process registered


def _forwardable(op) -> bool:
    # a kernel that forwards to CPU needs a CPU kernel (or a composite one CPU runs) to reach
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), "CPU")


def _composite_implicit(op) -> bool:
    # NOTE: core ATen lists a few CompositeImplicitAutograd ops (upsample_bilinear2d.vec,
    # var.dim, avg_pool1d...). A device kernel for one replaces its composite, autograd
    # included, and its gradient is lost; like any real backend, edref leaves them to the
    # composite, which calls ops it has (or that eagerdecomp decomposes).
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _check_name(name: str) -> None:
    if name not in REFERENCE_DEVICES:
        raise BackendError(
            f"unknown reference device {name!r}; expected one of {sorted(REFERENCE_DEVICES)} "
            "(edref: core ATen, edprims: the prims_fusion preset)"
        )


def device_ops(name: str = DEVICE_NAME) -> OpSet:
    """The ops reference device ``name`` has kernels for: its preset (:data:`REFERENCE_DEVICES`)
    + runtime extras + device runtime ops, less the preset's CompositeImplicitAutograd ops (which
    never reach a backend)."""
    _check_name(name)
    runtime = OpSet(list(DEVICE_RUNTIME_OPS) + list(_RUNTIME_OPS[name]))
    ops = OpSet.preset(REFERENCE_DEVICES[name]) | OpSet(list(RUNTIME_EXTRAS)) | runtime
    keep = [
        op
        for op in ops
        if op.namespace in ("aten", "prims") and _forwardable(op) and (op in runtime or not _composite_implicit(op))
    ]
    return OpSet(keep, name=f"{name} kernels")


def _device_module(name: str) -> types.ModuleType:
    # torch looks some things up on torch.<device> (torch.get_device_module, optimizers'
    # device checks, torch.manual_seed); one device, always available, draws from the CPU RNG
    mod = types.ModuleType(
        f"torch.{name}", f"eagerdecomp's reference device (host memory, {REFERENCE_DEVICES[name]} only)"
    )
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed = mod.manual_seed_all = lambda seed: None  # torch.manual_seed seeds the CPU RNG it uses
    mod.get_rng_state = lambda device=None: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    mod.synchronize = lambda device=None: None
    mod.device = lambda device: contextlib.nullcontext()  # one device: nothing to switch (torch.load uses it)
    # torch.autocast("edref") asks the device module which dtypes it may cast to; the cast
    # policies themselves are C++ kernels on the AutocastPrivateUse1 key (csrc/refdev.cpp)
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    for storage, cls in _legacy_storages(name).items():
        setattr(mod, storage, cls)
    # Inductor asks a PrivateUse1 device's module for its code generators when it starts
    # (torch._inductor.codegen.common.init_backend_registration); looked up lazily, so loading
    # the device imports none of Inductor
    mod.__getattr__ = _inductor_codegen
    return mod


# NOTE: edref's memory is host memory (csrc/refdev.cpp allocates with the CPU allocator and
# each kernel runs the CPU kernel on the same bytes), so CPU's code generators are sound for it:
# the C++ kernels Inductor generates read and write the tensors' data pointers, and the Python
# wrapper allocates its buffers with empty_strided on edref and calls edref's kernels (through
# the switch, when enabled) for what Inductor does not generate. A device with its own memory
# registers its own generators under these names instead.
_INDUCTOR_CODEGEN = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


@functools.cache
def _host_wrapper(base):
    """Inductor's Python wrapper, calling the C++ kernels it generated for edref as it calls
    CPU's (its kernel-call codegen knows cpu and the GPU stream devices only)."""
    from torch._inductor.virtualized import V

    class HostWrapper(base):
        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:  # (a subgraph's wrapper writes into its parent's)
                return base.create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures)
            return HostWrapper()

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == _loaded:
                device = torch.device("cpu")  # a C++ kernel on host memory: a plain call, no stream
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)

    return HostWrapper


def _inductor_codegen(name: str):
    if name not in _INDUCTOR_CODEGEN:
        raise AttributeError(f"module 'torch.{_loaded}' has no attribute {name!r}")
    from torch._dynamo.device_interface import CpuInterface, register_interface_for_device
    from torch._inductor.codegen.common import register_device_op_overrides
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

    from eagerdecomp.device import inductor

    # Dynamo and Inductor ask the device's interface for streams, events and properties: the CPU's
    register_interface_for_device(_loaded, CpuInterface)
    inductor.install(_loaded)  # and Inductor's own checks for a CPU must say yes (see there)
    register_device_op_overrides(_loaded, CpuDeviceOpOverrides())  # what the wrapper emits per device: the CPU's
    return {
        "Scheduling": CppScheduling,
        "PythonWrapperCodegen": _host_wrapper(PythonWrapperCodegen),
        "CppWrapperCodegen": CppWrapperCpu,
        "WrapperFxCodegen": WrapperFxCodegen,
    }[name]


def _legacy_storages(device: str) -> dict:
    """``FloatStorage``... on the device: ``Tensor.storage_type()`` and the legacy
    ``torch.<device>.FloatStorage(n)`` constructors look them up on the device module, as
    ``torch.cuda``'s. A class's device is read from its ``__module__``."""
    from torch._utils import classproperty
    from torch.storage import _dtype_to_storage_type_map, _LegacyStorage

    def storage_class(name, dtype):
        return type(
            name,
            (_LegacyStorage,),
            {
                "__module__": f"torch.{device}",
                "_dtype": classproperty(lambda cls: dtype),
                "dtype": classproperty(lambda cls: dtype),
            },
        )

    return {name: storage_class(name, dtype) for dtype, name in _dtype_to_storage_type_map().items()}


def reference_device(name: str = DEVICE_NAME) -> torch.device:
    """Build (or load, cached) and register reference device ``name`` (``"edref"``, the default,
    or ``"edprims"``); return ``torch.device(name, 0)``.

    Raises :class:`BackendError` when the C++ library cannot be built or loaded, or when
    another backend (the other reference device included) already owns PrivateUse1 in this process.
    """
    global _loaded
    _check_name(name)
    with _lock:
        if _loaded == name:
            return torch.device(name, 0)
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", name):
            raise BackendError(
                f"reference_device({name!r}): PrivateUse1 already belongs to backend {current!r} in this process; "
                f"expected it free to register {name!r}. PrivateUse1 is one dispatch key: run each reference "
                "device in its own process."
            )
        lib = _ext.load(build=True)
        if lib is None:
            why = "EAGERDECOMP_NO_EXT=1 forces the pure-Python path" if _ext.disabled() else _ext.status()["error"]
            raise BackendError(
                f"reference_device: the C++ library is not available ({why}); expected a "
                "prebuilt eagerdecomp._C or a working compiler for the just-in-time build. Install with "
                "`pip install --no-build-isolation -e .`, or unset EAGERDECOMP_NO_EXT."
            )
        if current == "privateuseone":
            torch.utils.rename_privateuse1_backend(name)
        lib.register_device(sorted(op.name() for op in device_ops(name)))
        torch._register_device_module(name, _device_module(name))
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
        _loaded = name
    _check_autograd()
    return torch.device(name, 0)


def _tiny_backward() -> None:
    # NOTE: the engine itself, not torch.autograd.grad or backward(): the device's autograd
    # thread keeps the last graph task it ran until it runs another, and one that holds a
    # Python object (grad's results, the context backward() stashes) freed during interpreter
    # finalization aborts the process ("terminate called without an active exception"). This
    # one holds none: no outputs, and x.grad never reaches Python. A dtype cast (_to_copy) is
    # an op both reference devices have, forward and backward.
    x = torch.ones(2).to(_loaded).requires_grad_()
    engine = torch.autograd.Variable._execution_engine
    y = x.to(torch.float64)
    engine.run_backward((y,), (torch.ones(2, dtype=torch.float64).to(_loaded),), False, False, (), True, True)


def _check_autograd() -> None:
    # NOTE: the autograd engine sizes its per-device queues once, at the process's first
    # backward pass; a device registered after that cannot run backward. A tiny backward on
    # the device (core ops only) starts the engine with edref known, or finds it too late.
    try:
        _tiny_backward()
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        raise BackendError(
            "reference_device: a backward pass ran in this process before the reference device was "
            "registered, and the autograd engine only knows the devices present at its first backward; "
            "expected reference_device() to be called first. Call it at the start of the program."
        ) from None
    atexit.register(_release_last_graph_task)


def _release_last_graph_task() -> None:
    # the program's last backward is the graph task the device thread keeps: swap it for a
    # harmless one while the interpreter is still whole (atexit runs before finalization)
    try:
        with torch.enable_grad():
            _tiny_backward()
    except RuntimeError:  # best effort at exit (e.g. inside inference_mode): the abort is PyTorch's
        pass


def is_loaded() -> bool:
    """True once :func:`reference_device` has registered a reference device in this process."""
    return _loaded is not None


def loaded_name() -> str | None:
    """The reference device this process registered (``"edref"``, ``"edprims"``), or None."""
    return _loaded


@contextlib.contextmanager
def op_log():
    """Count the ops that run on the reference device inside the block (the device's own witness).

    Yields a :class:`~collections.Counter` of op names (``"mul.Tensor"``, prims as
    ``"prims::mul"``), filled on exit. Not reentrant: the device keeps one log.
    """
    lib = _ext.load(build=True)
    if lib is None or not _loaded:
        raise BackendError("op_log: the reference device is not loaded; call reference_device() first")
    ran: Counter = Counter()
    lib.op_log_clear()
    lib.set_logging(True)
    try:
        yield ran
    finally:
        lib.set_logging(False)
        ran.update({name.removeprefix("aten::"): n for name, n in lib.op_log().items()})
        lib.op_log_clear()
