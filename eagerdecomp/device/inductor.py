"""Inductor on a reference device: the device checks that must say "CPU" for host memory.

The reference devices' memory is host memory (csrc/refdev.cpp), so their module offers
Inductor CPU's code generators (:func:`eagerdecomp.device.refdev._inductor_codegen`). That is
not enough: besides asking a device for its code generators, Inductor decides a CPU by
comparing the device's type with ``"cpu"``, in the scheduler (which fusions it tries), in its
lowerings and decompositions (which IR it emits for the C++ generator) and in the kernels'
code generators themselves (which backend's dtype rules apply). A PrivateUse1 device fails
each test, so its nodes took the GPU paths while the C++ generator wrote their code: the
scheduler's loop reindexing for Triton fused them (``TypeError: can't multiply sequence by
non-int of type 'tuple'`` on any reduction), and the C++ kernels lost the dtypes of their
index variables (``indirect_assert`` on ``index_copy_``).

NOTE: PyTorch has no public way for a device to say "I am CPU-like" (torch 2.13: the checks
are ``device.type == "cpu"``, ``is_cpu(...)`` and ``get_current_backend()``), so :func:`install`
patches those checks, and only for the loaded reference device: each patched predicate answers
for the reference device as Inductor answers for ``"cpu"``, and calls Inductor's own for every
other device. The patched places are listed in :data:`PREDICATES` and :data:`INLINE` with
their reasons; :func:`install` fails if one of Inductor's tests is not where it was, and the test
(tests/device/test_inductor.py) checks that Inductor writes the same kernels for the device as
for CPU, so a PyTorch upgrade that adds a check shows there.

Not claimed: oneDNN (``SUPPORTED_MKLDNN_DEVICES``), so Inductor keeps a GPU's layout choice for
convolutions (CPU's channels-last choice made the fake convolution disagree with the device's).
NOTE: Inductor's on-disk FX graph cache keys on its own source, not on these patches; code it
cached for the device before they existed (pointwise graphs only: nothing else compiled) is
still correct, written with GPU heuristics.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
import threading

import torch

from eagerdecomp.errors import BackendError

__all__ = ["PREDICATES", "INLINE", "install", "installed"]

# Inductor's predicates, replaced by ones that answer for the reference device as for "cpu":
# module.attribute -> why Inductor's answer must be CPU's for host memory
PREDICATES = {
    "scheduler.BaseSchedulerNode.is_cpu": "fusion: CPU nodes skip the loop reordering and reindexing written for "
    "Triton (the C++ generator's node groups are (sizes, reduction sizes) tuples, not numbers)",
    "ir.is_cpu": "realization heuristics: CPU's thresholds on an inner function's op count and reads",
    "utils.get_current_backend": "the kernel backend of the current device: 'cpp' (config.cpu_backend), "
    "whose dtype propagation gives indirect indices their dtype, not config.cuda_backend ('triton')",
    "codegen.common.get_current_backend": "(the same, bound by name)",
    "scheduler.get_current_backend": "(the same, bound by name)",
    "fx_passes.pre_grad.is_cpu_device": "pre-grad passes: no GPU permute fusions, CPU's conv-bn folding when frozen",
}

# Inductor's tests written inline, each rewritten in its function's code (the same function
# object, so every registration of it sees the change): (module, function, Inductor's test, why).
# The test becomes `<device>.type in ("cpu", <reference device>)`.
INLINE = [
    ("lowering", "div_prim", 'a.get_device().type != "cpu"', "CPU divides by a constant (no reciprocal: its rounding)"),
    ("lowering", "use_two_step_variance", 'device and device.type == "cpu"', "CPU's variance algorithm (two-step)"),
    ("lowering", "cat", 'inputs[0].get_device().type == "cpu"', "int8 cat falls back (the C++ generator's vectors)"),
    ("lowering", "_pad_as_cat", 'device is not None and device.type == "cpu"', "CPU's cat is a ConcatKernel"),
    ("lowering", "_make_reduction_inner", 'ir.get_device_type(x) == "cpu"', "argmax/argmin on strided inputs"),
    (
        "lowering",
        "quantized_decomposed_quantize_per_tensor_tensor",
        'device and device.type == "cpu"',
        "CPU's rounding",
    ),
    ("lowering", "bernoulli_", 'x.get_device() == torch.device("cpu")', "bernoulli_ has CPU's lowering"),
    ("lowering", "bernoulli_p", 'x.get_device() == torch.device("cpu")', "(the same)"),
    ("decomposition", "bmm", 'self.device.type == "cpu"', "CPU's small-bmm decomposition"),
    ("decomposition", "addmm", 'self.device.type == "cpu"', "CPU's small-addmm decomposition"),
    ("decomposition", "mm", 'self.device.type == "cpu"', "CPU's small-mm decompositions (two tests)"),
    ("decomposition", "mm", 'self.device.type not in ["cpu", "mps"]', "(a GPU's decomposition otherwise)"),
    ("kernel.bmm", "tuned_bmm", 'x.get_device().type == "cpu"', "CPU's memory-bound bmm decomposition"),
    ("utils", "use_scatter_fallback", 'src_device_type == "cpu"', "CPU's scatter_reduce sum fallback"),
]

_lock = threading.Lock()
_installed: str | None = None


def installed() -> str | None:
    """The device type whose Inductor checks are patched, or None."""
    return _installed


def install(device_type: str) -> None:
    """Make Inductor's CPU checks answer for ``device_type`` (a host-memory device) as for CPU.

    Idempotent; one device per process (PrivateUse1 is one key)."""
    global _installed
    with _lock:
        if _installed == device_type:
            return
        if _installed is not None:
            raise BackendError(
                f"Inductor's CPU checks are patched for {_installed!r} already, not {device_type!r}; expected "
                "one host-memory device per process (PrivateUse1 is one dispatch key)"
            )
        _patch(device_type)
        _installed = device_type


def _patch(host: str) -> None:
    from torch._inductor import ir, scheduler, utils
    from torch._inductor.codegen import common
    from torch._inductor.fx_passes import pre_grad

    rewrites = _inline_rewrites(host)  # first: a test that moved raises before anything changes

    def host_type(t: str | None) -> str | None:
        return "cpu" if t == host else t

    def is_cpu_node(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", host)

    scheduler.BaseSchedulerNode.is_cpu = is_cpu_node

    ir_is_cpu = ir.is_cpu
    ir.is_cpu = functools.wraps(ir_is_cpu)(lambda x: ir.get_device_type(x) == host or ir_is_cpu(x))

    backend = utils.get_current_backend

    @functools.wraps(backend)
    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return backend(host_type(device_type))

    for mod in (utils, common, scheduler):
        mod.get_current_backend = get_current_backend

    cpu_inputs = utils.is_cpu_device

    @functools.wraps(cpu_inputs)
    def is_cpu_device(inputs) -> bool:
        return all(t.device.type in ("cpu", host) for t in inputs if isinstance(t, torch.Tensor))

    pre_grad.is_cpu_device = is_cpu_device

    for fn, code in rewrites:
        fn.__code__ = code  # (the same function object: every registration of it sees the change)


def _host_test(test: str, host: str) -> str:
    """Inductor's test of a device type for "cpu", made to accept ``host`` as well."""
    either = f'("cpu", {host!r})'
    return (
        test.replace('== torch.device("cpu")', f".type in {either}")
        .replace('!= "cpu"', f"not in {either}")
        .replace('== "cpu"', f"in {either}")
        .replace('["cpu", "mps"]', f'["cpu", "mps", {host!r}]')
    )


def _inline_rewrites(host: str) -> list:
    """(function, its code with the device tests rewritten) for :data:`INLINE`; changes nothing."""
    out = []
    edits: dict[tuple[str, str], list[str]] = {}
    for module, name, test, _ in INLINE:
        edits.setdefault((module, name), []).append(test)
    for (module, name), tests in edits.items():
        fn = importlib.import_module(f"torch._inductor.{module}")
        for attr in name.split("."):
            fn = getattr(fn, attr)
        fn = inspect.unwrap(fn)
        source = textwrap.dedent(inspect.getsource(fn))
        for test in tests:
            if test not in source:
                raise BackendError(
                    f"torch._inductor.{module}.{name} no longer tests {test!r}; expected the torch version "
                    f"eagerdecomp.device.inductor was written for (2.13), found {torch.__version__}"
                )
            source = source.replace(test, _host_test(test, host))
        tree = ast.parse(source)
        tree.body[0].decorator_list = []  # (the function object keeps its registrations)
        ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
        code = compile(tree, fn.__code__.co_filename, "exec")
        (new,) = [c for c in code.co_consts if inspect.iscode(c) and c.co_name == fn.__name__]
        assert new.co_freevars == fn.__code__.co_freevars, (module, name)
        out.append((fn, new))
    return out
