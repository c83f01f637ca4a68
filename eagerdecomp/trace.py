"""Trace one op's decomposition, once, into an FX kernel over fake tensors.

Tracing runs on fake tensors so no data value is baked in and nothing is
executed for real (an in-place op is applied once, on its real call, and no
random numbers are drawn). The :class:`~eagerdecomp.lower.Lowerer` records
every opset op it reaches as a graph node. The result is then checked against
the op's own meta kernel (its eager output metadata) and its schema:

* dtype, shape and device must match, else :class:`MismatchError`;
* an in-place/out= op must return its mutated input object, and a view op a
  view of its input, else :class:`MismatchError`;
* a functional op whose decomposition returns an input (or a view of one)
  gets a ``clone`` so the output does not alias, as in eager;
* a view op whose decomposition returns its input object gets an ``alias``;
* a fresh output whose significant strides differ from eager's is copied
  into an ``empty_strided`` of eager's strides.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._prims_common import check_significant_strides
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import DeviceMismatchError, MismatchError, TraceError, UnsupportedOpError
from .key import Bypass
from .lower import _IDENTITY, Lowerer, Stuck
from .lift import stand_ins
from .replay import Kernel
from .quiet import quiet

__all__ = ["trace", "swap_tensors", "unalias", "LiftRefused"]

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




def _check_devices(func, tensors) -> None:
    devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
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
        self.shares = [isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in storages for o in outs]

    def out(self, i):
        return self.outs[i] if i < len(self.outs) else None


def _fake_mode() -> FakeTensorMode:
    mode = FakeTensorMode()
    # NOTE: FakeTensorMode's dispatch cache is class-wide and unbounded, keyed by shapes: with
    # shapes that change every call it grows for the life of the process. Our kernel cache is
    # the bounded one; a trace meets each (op, shape) about once, so the fake cache buys little.
    mode.cache_enabled = False
    return mode


def _reference(func, args, kwargs):
    """A :class:`_Ref` for this call; None if the op has no meta kernel."""
    mode = _fake_mode()
    fakes = [mode.from_tensor(t) for t in _flat_tensors(args, kwargs)]
    it = iter(fakes)
    fargs = swap_tensors(args, it)
    fkwargs = {k: swap_tensors(v, it) for k, v in kwargs.items()}
    try:
        with quiet(), mode:  # the real call warns for itself
            out = func(*fargs, **fkwargs)
    except Exception:  # noqa: BLE001 - no meta kernel: nothing to check against
        return None
    outs = tree_flatten(out)[0]
    if func in _META_LAYOUT_FIXES:
        with mode:
            outs = [_META_LAYOUT_FIXES[func](o, fargs) for o in outs]
    return _Ref(outs, fakes)


def _input_layout(out, args):
    layout = torch._prims_common.suggest_memory_format(args[0]) if args[0].dim() == 4 else torch.contiguous_format
    return out.contiguous(memory_format=layout)


# NOTE: meta kernels whose strides are not eager's (found by the conformance suite); the
# reference is what the trace restrides to, so it must be eager's layout.
_META_LAYOUT_FIXES = {
    aten.max_unpool2d.default: _input_layout,  # eager keeps a channels-last input channels-last
}


def _flat_tensors(args, kwargs) -> list:
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


def _same_view(r, o) -> bool:
    return r.storage_offset() == o.storage_offset() and (o.numel() <= 1 or check_significant_strides(r, o, only_cuda=False)[0])


def _finish_outputs(func, emitter, fargs, fkwargs, flat_out, ref, fixups):
    """Check outputs against eager's metadata and aliasing; return the graph's output nodes."""
    g, schema = emitter.graph, func._schema
    inputs = [t for t in _flat_tensors(fargs, fkwargs)]
    in_storages = {_storage(t) for t in inputs}
    nodes = []
    for i, o in enumerate(flat_out):
        if not isinstance(o, torch.Tensor):
            nodes.append(o)
            continue
        node = emitter.node(o)
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
                raise MismatchError(f"{func}: its decomposition does not return the mutated input {name!r}, as eager does")
            if not is_write and isinstance(src, torch.Tensor):
                if o is src and func not in _IDENTITY:
                    node, _ = g.call_function(aten.alias.default, (node,)), fixups.append("alias")
                elif _storage(o) != _storage(src):
                    raise MismatchError(f"{func}: its decomposition returns a copy where eager returns a view of {name!r}")
        elif _storage(o) in in_storages:
            if not eager_shares:
                node, _ = g.call_function(aten.clone.default, (node,)), fixups.append("clone")
            elif isinstance(r, torch.Tensor) and not _same_view(r, o):
                raise MismatchError(
                    f"{func}: output {i} of its decomposition is a view with strides {o.stride()} at offset "
                    f"{o.storage_offset()}, eager's has {r.stride()} at {r.storage_offset()}; register a correct "
                    "decomposition or add the op to the opset"
                )
        elif eager_shares:
            raise MismatchError(f"{func}: output {i} of its decomposition is a copy where eager returns a view of an input")
        elif isinstance(r, torch.Tensor) and o.numel() > 1 and not check_significant_strides(r, o, only_cuda=False)[0]:
            fresh = g.call_function(
                aten.empty_strided.default, (list(r.shape), list(r.stride())), {"dtype": r.dtype, "device": r.device}
            )
            node, _ = g.call_function(aten.copy_.default, (fresh, node)), fixups.append("restride")
        nodes.append(node)
    return nodes


def unalias(func, args, kwargs, out):
    """On the bypass path (no kernel, no meta kernel to consult): a functional op's outputs
    that share memory with an input are cloned, as :func:`_finish_outputs` does when tracing.

    NOTE: judged by the schema alone, so an op that returns views without saying so
    (unsafe_split) would be cloned here; such ops trace, and never take this path.
    """
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return out
    flat, spec = tree_flatten(out)
    inputs = {_storage(t) for t in _flat_tensors(args, kwargs) if t.layout == torch.strided}
    if not any(isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in inputs for o in flat):
        return out
    flat = [
        aten.clone.default(o) if isinstance(o, torch.Tensor) and o.layout == torch.strided and _storage(o) in inputs else o
        for o in flat
    ]
    return tree_unflatten(flat, spec)


def trace(func, args: tuple, kwargs: dict, tensors: list, opset, table, lifted=()) -> Kernel:
    """Trace ``func(*args, **kwargs)``'s decomposition into a :class:`Kernel`.

    ``tensors`` are the call's tensors in key order (:func:`~eagerdecomp.key.make_key`);
    ``lifted`` the ``(position, value)`` of floats to make kernel inputs (see
    :mod:`eagerdecomp.lift`): the kernel then takes ``(*tensors, *values)``.
    Raises :class:`~eagerdecomp.key.Bypass` when the call cannot be replayed,
    :class:`LiftRefused` when its lifted floats change the graph, and
    :class:`UnsupportedOpError` when it has no path to ``opset``.
    """
    _check_devices(func, tensors)
    with _disable_current_modes():  # nothing below our mode may see tracing
        ref = _reference(func, args, kwargs)
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
        if not _same_kernel(*kernels):
            raise LiftRefused(f"{func}: its graph depends on the value of a float argument")
        return kernels[0]


class LiftRefused(Exception):
    """Two stand-in values of a lifted float traced different graphs: key by value instead."""


def _same_kernel(a: Kernel, b: Kernel) -> bool:
    consts_a, consts_b = a.module._constants, b.module._constants
    return (
        a.module.code == b.module.code
        and a.warnings == b.warnings
        and consts_a.keys() == consts_b.keys()
        and all(consts_a[n].dtype == consts_b[n].dtype and torch.equal(consts_a[n], consts_b[n]) for n in consts_a)
    )


def _trace_once(func, args, kwargs, tensors, opset, table, ref, scalars) -> Kernel:
    fake_mode = _fake_mode()
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
    nodes = _finish_outputs(func, emitter, fargs, fkwargs, flat_out, ref, fixups)
    emitter.graph.output(nodes)
    # NOTE: FX keeps each generated module's source for tracebacks under a fresh file name, for
    # the life of the process; one name per op keeps that bounded (a traceback may then show
    # another kernel's source of the same op).
    emitter.graph._co_fields = {"co_filename": f"<eagerdecomp kernel {func}>"}
    module = fx.GraphModule(emitter.constants, emitter.graph, class_name=f"Kernel_{func.__name__.replace('.', '_')}")
    module._constants = emitter.constants
    return Kernel(func, module, spec, [(text, UserWarning) for text in caught], fixups)
