"""The CPU tier: the last route of an op with no path to a device's kernels.

On a device enabled with ``on_unsupported="cpu"`` (or ``EAGERDECOMP_DEVICES=mydevice:cpu``) an
op runs, in this order: the device's own kernel; else its decomposition onto the device's
kernels (traced once, cached, replayed); else PyTorch's composite kernel where the device
switch took one over; else, and only else, this tier: the CPU's kernel on host copies of the
arguments, the results copied back (``csrc/host.cpp``). Under
``EagerDecompMode(on_unsupported="cpu")`` the same holds for calls on an accelerator; a call
on CPU tensors runs its own kernel (``fallthrough``).

Exact, or a clear error. The host copies keep each tensor's sizes, strides and offset and
which tensors share memory, so the CPU kernel computes what it computes in eager; in-place
and ``out=`` results land in the caller's tensors (version counters bumped once, by
autograd, as eager bumps them; an ``out=`` resized as the kernel resized it). Refused with
:class:`~eagerdecomp.errors.UnsupportedOpError`, by the op's schema and tags (:data:`RULES`):
ops whose result must alias an input (views; ``as_strided_`` and the other in-place views;
the ``set_`` family), since a host copy cannot alias device memory; random ops, unless the
device's generator is the CPU's (otherwise they would draw from another stream); arguments
other than plain strided tensors (sparse, quantized, a tensor subclass). Arguments eager
refuses (mixed devices, bad shapes) get eager's own error from the op's meta kernel.

On the record. Every call is counted in the report under the route ``cpu fallback`` with
the blocking op of its chain, the bytes copied each way and the time spent copying; the
first call of each op logs one warning (logger ``eagerdecomp``, so the logging setup
silences it). ``EAGERDECOMP_CPU_FALLBACK_OPS`` (comma-separated op names: ``linalg_eigh``,
``aten::_linalg_svd``, or one overload ``aten._linalg_eigh.eigenvalues``) limits the tier to those
ops; ``EAGERDECOMP_CPU_FALLBACK_DENY`` keeps ops out of it. A name covers every overload that can
arrive for it: its in-place and out= variants, and for a CompositeImplicitAutograd op such as
``linalg_eigh`` (which never reaches a backend) the ops its composite calls
(:func:`~eagerdecomp.ops.opset.resolve_reaching`). Both are read when the device is enabled or
the mode made.

Per call the decision is Python's once per key; later calls with that key on the device
switch are served by the C++ fallback with no Python (``csrc/hit.cpp``). Needs the C++ library.
"""

from __future__ import annotations

import itertools
import os
import threading

import torch
from torch.utils._python_dispatch import _disable_current_modes

from eagerdecomp.errors import BackendError, UnknownOpError, UnsupportedOpError
from eagerdecomp.ops.opset import resolve_reaching
from eagerdecomp.runtime import library as _ext
from eagerdecomp.runtime.exact import flat_tensors, reference, refused
from eagerdecomp.runtime.observe import log, profiling, ranged
from eagerdecomp.runtime.stats import Route

__all__ = ["HostTier", "RULES", "ENV_OPS", "ENV_DENY", "device_of", "schema_refusal", "untraceable"]

ENV_OPS = "EAGERDECOMP_CPU_FALLBACK_OPS"
ENV_DENY = "EAGERDECOMP_CPU_FALLBACK_DENY"


def _view(op) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


# Ops the tier refuses, by schema and tags: (test, why). Random ops are decided per device.
RULES = (
    (
        lambda op: torch.Tag.inplace_view in op.tags,
        "it changes a tensor's sizes or strides in place (an in-place view), which a copy on the host cannot do",
    ),
    (_view, "its result must alias an input (a view), and a host copy cannot alias device memory"),
    (
        lambda op: op._schema.name == "aten::set_",
        "it makes a tensor use another storage (the set_ family), and a host storage cannot be a device tensor's",
    ),
)


def schema_refusal(op) -> str | None:
    """Why the tier never runs ``op`` on any device (:data:`RULES`), or None."""
    return next((why for test, why in RULES if test(op)), None)


_tokens = itertools.count(1)  # one per tier: a C++ program runs only for the tier that installed it


def _ops(variable: str) -> frozenset:
    """The overloads a list variable names (``linalg_eigh``, ``aten::_linalg_svd``, one overload
    ``aten._linalg_eigh.eigenvalues``); an unknown name is an error naming the variable.

    NOTE: a name reaches every overload that can arrive here for it (:func:`resolve_reaching`):
    what reaches the tier is rarely the op the user called (``linalg_eigh`` arrives as
    ``_linalg_eigh.eigenvalues``, ``_fused_adamw`` as ``_fused_adamw_``), and a list matching
    only the overloads a name denotes would silently match nothing."""
    names = [n for n in (s.strip() for s in os.environ.get(variable, "").split(",")) if n]
    try:
        return frozenset(o for n in names for o in resolve_reaching(n))
    except UnknownOpError as e:
        raise UnknownOpError(f"{variable}: {e}") from None


class HostTier:
    """The CPU tier of one runtime: which ops may use it (once per op), and the call itself."""

    def __init__(self):
        lib = _ext.load()
        if lib is None or not hasattr(lib, "host"):
            raise BackendError(
                "on_unsupported='cpu' needs eagerdecomp's C++ library (csrc/host.cpp), which is not loaded "
                f"({_ext.status()['loaded']}); expected a build with it. Reinstall from source with a C++ "
                "compiler (pip install --no-build-isolation .), or use on_unsupported='error'."
            )
        self._run = lib.host.run
        self._draws_from_cpu = lib.host.draws_from_cpu
        self.token = next(_tokens)
        self.ops, self.deny = _ops(ENV_OPS), _ops(ENV_DENY)
        self._refusals: dict = {}  # (op, device type) -> why it may not run on the host, or None
        self._warned: set = set()
        self._lock = threading.Lock()

    def refusal(self, op, device: torch.device) -> str | None:
        """Why ``op`` may not fall back to the CPU from ``device``, or None."""
        k = (op, device.type)
        if k not in self._refusals:
            self._refusals[k] = self._decide(op, device)
        return self._refusals[k]

    def _decide(self, op, device) -> str | None:
        if op in self.deny:
            return f"it is in {ENV_DENY}"
        if self.ops and op not in self.ops:
            return f"it is not in {ENV_OPS}"
        why = schema_refusal(op)
        if why is not None:
            return why
        if torch.Tag.nondeterministic_seeded in op.tags and not self._draws_from_cpu(device):
            return (
                f"it draws random numbers, and {device.type}'s generator is not the CPU's: the CPU kernel "
                "would draw from another stream"
            )
        return None

    def __call__(self, runtime, func, args, kwargs, error: UnsupportedOpError, cache, device: torch.device):
        """Run ``func`` on the CPU for ``device`` (of its arguments), or raise why it may not."""
        why = self.refusal(func, device) or _argument_refusal(args, kwargs)
        if why is not None:
            raise UnsupportedOpError(func, error.chain, f"{error.reason}; no CPU fallback: {why}") from None
        # eager's own error for arguments it refuses (mixed devices...): read from the meta kernel
        with _disable_current_modes():  # the meta kernel's calls are no mode's to see
            _, refusal = refused(reference(func, args, kwargs, refuse=True))
        if refusal is not None:
            raise refusal.error
        blocking = f"{error.chain[-1] if error.chain else func}: {error.reason}"
        if func not in self._warned:
            with self._lock:
                first = func not in self._warned
                self._warned.add(func)
            if first:
                log.warning(
                    "%s has no path to the opset on %s (%s): running it on the CPU, with copies each way. "
                    "Register a kernel or a decomposition for it to stay on the device.",
                    func,
                    device.type,
                    blocking,
                )
        if profiling():  # the call's range names what ran: the CPU kernel, with the copies
            out, to_host, to_device, seconds = ranged("cpu_fallback", func, self._run, func, args, kwargs, device)
        else:
            out, to_host, to_device, seconds = self._run(func, args, kwargs, device)
        runtime.stats.record(func, Route.CPU_FALLBACK, blocking, cache)
        runtime.stats.copied(func, blocking, to_host, to_device, seconds)
        return out


def untraceable(func, opset, table) -> tuple | None:
    """The chain a trace of ``func`` would stop at before tracing anything, else None: ``func``
    (an ATen op outside ``opset``) has no decomposition and no composite kernel, or is an
    in-place or out= variant whose functional op has none (followed through the variant rules
    of :mod:`eagerdecomp.ops.variants` alone, which call nothing else first).

    NOTE: for such an op the runtime goes to the tier without a trace over fake tensors: it
    would trace nothing (and cost the first call a Lowerer), and under ``torch.profiler`` the
    first call would show as ``eagerdecomp.trace <op>`` where only the CPU kernel ran.
    """
    from eagerdecomp.ops.implicit import is_implicit
    from eagerdecomp.ops.variants import rule_target
    from eagerdecomp.runtime.lower import IDENTITY_OPS

    chain: list = []
    op = func
    while op not in opset and op not in chain and op.namespace == "aten":
        chain.append(op)
        if torch.Tag.inplace_view in op.tags or op in IDENTITY_OPS or is_implicit(op):
            return None
        fn = table.get(op)
        if fn is None:
            return tuple(chain)
        op = rule_target(fn)  # the functional op the variant rule calls
        if op is None:
            return None
    return None


def device_of(args, kwargs) -> torch.device:
    """Where the results go: the first tensor off the CPU, else a ``device=`` argument."""
    for t in flat_tensors(args, kwargs):
        if t.device.type != "cpu":
            return t.device
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.device) and x.type != "cpu":
            return x
    return torch.device("cpu")


def _argument_refusal(args, kwargs) -> str | None:
    for t in flat_tensors(args, kwargs):
        if t.layout is not torch.strided:
            return f"an argument is a {t.layout} tensor; the tier copies strided tensors only"
        if t.is_quantized:
            return "an argument is a quantized tensor; the tier copies plain tensors only"
        if type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
            return f"an argument is a {type(t).__name__}, a tensor subclass; the tier copies plain tensors only"
    return None
