"""Trace one op's decomposition, once, into an FX kernel over fake tensors.

Tracing runs on fake tensors so no data value is baked in and nothing is
executed for real (an in-place op is applied once, on its real call, and no
random numbers are drawn). The :class:`~eagerdecomp.lower.Lowerer` records
every opset op it reaches as a graph node; :mod:`eagerdecomp.exact` then checks
the outputs against the op's own meta kernel and adds the fix-ups that make
the kernel eager-exact.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from .errors import MismatchError, TraceError, UnsupportedOpError
from .exact import check_devices, finish_outputs, new_fake_mode, reference, swap_tensors
from .key import Bypass
from .lift import LiftRefused, same_kernel, stand_ins
from .lower import Lowerer, Stuck
from .quiet import quiet
from .replay import Kernel

__all__ = ["trace"]

aten = torch.ops.aten


class _Emitter:
    """``emit`` for tracing: run the op on fakes and record it as a graph node."""

    def __init__(self, fake_mode: FakeTensorMode):
        self.fake_mode = fake_mode
        self.graph = fx.Graph()
        self.env: dict = {}  # id(fake) -> (fake, node); the fake is kept alive so ids stay unique
        self.constants: dict = {}
        self.scalars: dict = {}  # stand-in value of a lifted float -> its placeholder

    def placeholder(self, fake, i: int) -> None:
        self.env[id(fake)] = (fake, self.graph.placeholder(f"t{i}"))

    def scalar_placeholder(self, value: float, i: int) -> None:
        self.scalars[value] = self.graph.placeholder(f"s{i}")

    def node(self, x):
        if type(x) is float:
            return self.scalars.get(x, x)
        hit = self.env.get(id(x))
        if hit is not None:
            return hit[1]
        if isinstance(x, FakeTensor):
            raise TraceError(f"a fake tensor reached an opset op without passing through the trace: {x}")
        # a real tensor: a constant a decomposition made with torch.tensor(); bake it in
        name = f"c{len(self.constants)}"
        self.constants[name] = x
        fake = self.fake_mode.from_tensor(x)
        node = self.graph.get_attr(name)
        self.env[id(x)] = (x, node)
        self.env[id(fake)] = (fake, node)
        return node

    def _fake(self, x):
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            self.node(x)
            return self.fake_mode.from_tensor(x)
        return x

    def _map(self, fn, x):
        if isinstance(x, torch.Tensor) or type(x) is float:
            return fn(x)
        if type(x) is list or type(x) is tuple:
            return type(x)(self._map(fn, y) for y in x)
        return x

    def __call__(self, func, args, kwargs):
        nargs = self._map(self.node, args)
        nkwargs = {k: self._map(self.node, v) for k, v in kwargs.items()}
        out = func(*self._map(self._fake, args), **{k: self._map(self._fake, v) for k, v in kwargs.items()})
        self.bind(out, self.graph.call_function(func, nargs, nkwargs))
        return out

    def bind(self, out, node) -> None:
        if isinstance(out, torch.Tensor):
            self.env[id(out)] = (out, node)
        elif type(out) is list or type(out) is tuple:
            for i, o in enumerate(out):
                if isinstance(o, (torch.Tensor, list, tuple)):
                    self.bind(o, self.graph.call_function(operator.getitem, (node, i)))




def trace(func, args: tuple, kwargs: dict, tensors: list, opset, table, lifted=()) -> Kernel:
    """Trace ``func(*args, **kwargs)``'s decomposition into a :class:`Kernel`.

    ``tensors`` are the call's tensors in key order (:func:`~eagerdecomp.key.make_key`);
    ``lifted`` the ``(position, value)`` of floats to make kernel inputs (see
    :mod:`eagerdecomp.lift`): the kernel then takes ``(*tensors, *values)``.
    Raises :class:`~eagerdecomp.key.Bypass` when the call cannot be replayed,
    :class:`LiftRefused` when its lifted floats change the graph, and
    :class:`UnsupportedOpError` when it has no path to ``opset``.
    """
    check_devices(func, tensors)
    with _disable_current_modes():  # nothing below our mode may see tracing
        ref = reference(func, args, kwargs)
        if not lifted:
            return _trace_once(func, args, kwargs, tensors, opset, table, ref, ())
        kernels = []
        for which in (0, 1):
            values = stand_ins(lifted, which)
            a, k = list(args), dict(kwargs)
            for (pos, _), v in zip(lifted, values):
                if type(pos) is int:
                    a[pos] = v
                else:
                    k[pos] = v
            kernels.append(_trace_once(func, tuple(a), k, tensors, opset, table, ref, values))
        if not same_kernel(*kernels):
            raise LiftRefused(f"{func}: its graph depends on the value of a float argument")
        return kernels[0]


def _trace_once(func, args, kwargs, tensors, opset, table, ref, scalars) -> Kernel:
    fake_mode = new_fake_mode()
    emitter = _Emitter(fake_mode)
    fakes = [fake_mode.from_tensor(t) for t in tensors]
    for i, f in enumerate(fakes):
        emitter.placeholder(f, i)
    for i, v in enumerate(scalars):
        emitter.scalar_placeholder(v, i)
    it = iter(fakes)
    fargs = swap_tensors(args, it)
    fkwargs = {k: swap_tensors(v, it) for k, v in kwargs.items()}
    lowerer = Lowerer(opset, table, emitter)
    try:
        # NOTE: only the warning eager raises on every call (an out= tensor resized) is kept
        # for replay; anything else raised while tracing, such as deprecations inside torch's
        # decompositions, is an artifact of tracing and dropped (see eagerdecomp.quiet).
        with quiet() as caught, fake_mode:
            out = lowerer.lower(func, fargs, fkwargs)
    except Stuck as e:
        raise UnsupportedOpError(func, e.chain, e.reason) from None
    except RecursionError:
        raise UnsupportedOpError(func, lowerer.chain, "decomposition recursed past Python's limit") from None
    except DataDependentOutputException:
        raise Bypass("needs a data value") from None
    except DynamicOutputShapeException:
        raise Bypass("dynamic output shape") from None
    except (MismatchError, TraceError):
        raise
    except Exception as e:  # noqa: BLE001
        # fake tensors cannot run it (or the call is invalid): decompose eagerly instead,
        # where a genuine argument error surfaces exactly as the decomposition raises it
        raise Bypass(f"trace failed: {type(e).__name__}") from e
    flat_out, spec = tree_flatten(out)
    fixups: list = []
    nodes = finish_outputs(func, emitter, fargs, fkwargs, flat_out, ref, fixups)
    emitter.graph.output(nodes)
    # NOTE: FX keeps each generated module's source for tracebacks under a fresh file name, for
    # the life of the process; one name per op keeps that bounded (a traceback may then show
    # another kernel's source of the same op).
    emitter.graph._co_fields = {"co_filename": f"<eagerdecomp kernel {func}>"}
    module = fx.GraphModule(emitter.constants, emitter.graph, class_name=f"Kernel_{func.__name__.replace('.', '_')}")
    module._constants = emitter.constants
    return Kernel(func, module, spec, [(text, UserWarning) for text in caught], fixups)
