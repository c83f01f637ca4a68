"""Lowering: decompose one op, recursively, until only opset ops are called.

:class:`Lowerer` is a dispatch mode used in two ways: while tracing (its
``emit`` records each opset op into an FX graph and runs it on fake tensors)
and while decomposing eagerly on the bypass path (``emit`` just runs the op).
Both walk the same route, so a replayed kernel and an eager decomposition
call exactly the same opset ops.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eagerdecomp.ops.checks import alert, warn_once
from eagerdecomp.ops.opset import RUNTIME_EXTRAS
from eagerdecomp.ops.variants import functional_variant
from eagerdecomp.runtime import routes
from eagerdecomp.runtime.routes import is_infrastructure  # noqa: F401 - re-exported

__all__ = ["Lowerer", "Stuck", "IDENTITY_OPS"]

aten = torch.ops.aten

# A decomposition may legitimately re-enter its own op with other arguments;
# past this many nested entries of one op, it is a cycle.
MAX_REENTRY = 3
MAX_DEPTH = 64

# NOTE: lift_fresh returns its argument object itself; torch.tensor() inside a
# decomposition calls it on a real constant, which tracing bakes into the kernel.
IDENTITY_OPS = {aten.lift_fresh.default}


# NOTE: which non-ATen ops pass through (infrastructure, collectives, opaque custom
# kernels) and which custom ops run their own implementation is decided in routes.py;
# is_infrastructure stays importable from here for older callers.


class Stuck(Exception):
    """No path to the opset: ``chain`` is the ops being decomposed, outermost first."""

    def __init__(self, chain, reason):
        super().__init__(f"{' -> '.join(map(str, chain))}: {reason}")
        self.chain, self.reason = list(chain), reason


class Lowerer(TorchDispatchMode):
    """Routes every op below it: opset ops to ``emit``, others to their decomposition."""

    def __init__(self, opset, table, emit):
        super().__init__()
        self.opset = opset
        self.table = table
        self.emit = emit
        self.chain: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.opset:
            return self.emit(func, args, kwargs)
        route = routes.custom_route(func, self.table)
        if route is not None:
            if route.name == routes.INFRASTRUCTURE:
                return func(*args, **kwargs)
            if route.name != routes.CUSTOM_IMPL:
                # NOTE: collectives and opaque custom kernels met inside a decomposition are
                # kept as calls, like opset ops: the process group or the user's kernel runs them
                return self.emit(func, args, kwargs)
        return self.lower(func, args, kwargs)

    def lower(self, func, args, kwargs):
        """Decompose ``func`` with this lowerer active for everything it calls."""
        if func in IDENTITY_OPS:
            return args[0]
        chain = self.chain
        if chain.count(func) >= MAX_REENTRY or len(chain) >= MAX_DEPTH:
            raise Stuck(chain + [func], "decomposition cycle")
        if not chain:  # the op called: eager's nondeterminism alert and once-per-process warning
            alert(func, args, kwargs)
            warn_once(func, args, kwargs)
        chain.append(func)
        try:
            fn = self.table.get(func) or routes.implementation(func, args, kwargs)
            if fn is None and func in RUNTIME_EXTRAS:
                # NOTE: set_ and as_strided_ change which memory a tensor object is: no graph
                # expresses that, so an opset without them (a custom one) has no path
                raise Stuck(chain, f"no decomposition: a runtime op every preset keeps ({RUNTIME_EXTRAS[func]})")
            if fn is None and torch.Tag.inplace_view in func.tags:
                return self._inplace_view(func, args, kwargs)
            if fn is not None:
                with self:
                    out = fn(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            with self:
                out = func.decompose(*args, **kwargs)  # CompositeImplicitAutograd kernel, if any
            if out is not NotImplemented:
                return out
            raise Stuck(chain, "no decomposition" if fn is None else "its decomposition declined these arguments")
        finally:
            chain.pop()

    def _inplace_view(self, func, args, kwargs):
        # NOTE: t_, squeeze_, transpose_... change a tensor's view in place, which no
        # functional graph expresses. Compute the functional view, then restride the
        # original tensor object with as_strided_ (in every preset's runtime extras).
        functional = functional_variant(func)
        if functional is None or aten.as_strided_.default not in self.opset:
            raise Stuck(self.chain, "metadata-mutating op; needs aten.as_strided_ in the opset")
        with self:
            view = functional(*args, **kwargs)
            self_ = args[0]
            self_.as_strided_(view.shape, view.stride(), view.storage_offset())
        return self_
