"""Sample inputs for the coverage analysis: real arguments for as many aten overloads as we can.

A decomposition is a Python function whose calls depend on its arguments, so the
coverage analysis lowers each op on concrete inputs. They come, best first, from:

``opinfo``
    the calls that reach a dispatch mode while PyTorch's OpInfo samples run,
    forward and backward (so backward ops such as ``gelu_backward`` get the
    arguments autograd really passes);
``program``
    the same capture around a few small programs, for ops that only a fused
    kernel's autograd or a model library calls (see ``_PROGRAMS``);
``opinfo-bound``
    an OpInfo sample passed straight to an overload of the OpInfo's own aten
    packet (the only way to reach CompositeImplicitAutograd overloads, which
    never reach a dispatch mode);
``derived``
    an in-place or ``out=`` overload called with its functional overload's
    sample (plus a fresh ``out`` tensor);
``synthesized``
    arguments made from the schema alone (shapes and values guessed);
``recorded``
    calls that other ops' decompositions made of it (added by the analysis, see
    :meth:`Pool.add_recorded`), kept besides the above.

Every sample but the captured ones is checked by running the op itself, on fake
tensors and then on copies of the real ones (meta kernels do not check dtypes): a
sample the op's own kernel rejects is dropped, never lowered. An op for which no
sample survives is reported as undetermined, with the reason.

Tensors are kept real (small, CPU) so a decomposition that needs a data value
can still be lowered on them. Meta kernels can crash the process on guessed
arguments (a segfault, a SIGFPE), so :mod:`eagerdecomp.coverage` calls
:func:`samples_for` in a forked worker, one op at a time.

Example::

    >>> import torch
    >>> from eagerdecomp.coverage.inputs import Pool, samples_for
    >>> pool = Pool.from_opinfo([torch.ops.aten.hardswish.default], names={"nn.functional.hardswish"})
    >>> found, why_none = samples_for(torch.ops.aten.hardswish.default, pool)
    >>> found[0].source, why_none
    ('opinfo', None)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import warnings
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from eagerdecomp.ops.variants import functional_variant

__all__ = ["Sample", "Pool", "samples_for", "fake_args", "quiet", "snapshot", "PER_OP"]

# Samples kept per overload: enough to see argument-dependent paths, few enough to stay fast.
PER_OP = 3
# OpInfo samples run per OpInfo entry.
PER_OPINFO = 3
# Calls other decompositions made of an op, kept besides its own samples.
RECORDED_PER_OP = 6


@dataclass
class Sample:
    """One call of an op: ``op(*args, **kwargs)`` with real, small CPU tensors."""

    args: tuple
    kwargs: dict
    source: str


def snapshot(x):
    """A detached copy with the same sizes, strides and storage offset (captured args mutate later)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.is_sparse or x.layout != torch.strided or x.is_quantized or x.is_nested:
        raise _Unusable(f"{x.layout} tensor")
    storage = x.untyped_storage()
    copy = torch.empty(0, dtype=x.dtype, device=x.device)
    copy.set_(storage.clone(), x.storage_offset(), x.shape, x.stride())
    return copy


class _Unusable(Exception):
    pass


def _signature(args, kwargs) -> tuple:
    def sig(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.stride(), x.dtype)
        return (type(x).__name__, repr(x)[:40])

    return tuple(sig(x) for x in tree_leaves((args, kwargs)))


def _kind(args, kwargs) -> tuple:
    """A coarse signature: calls that differ only in sizes are of one kind (what changes a
    decomposition's branches is mostly rank, dtype, layout, and scalar-vs-tensor)."""

    def sig(x):
        if isinstance(x, torch.Tensor):
            return ("T", x.dim(), x.dtype, x.is_contiguous())
        return (type(x).__name__, repr(x)[:40])

    return tuple(sig(x) for x in tree_leaves((args, kwargs)))


class Pool:
    """Samples by op: ``by_op`` holds checked ones (at most :data:`PER_OP` distinct per op);
    ``candidates`` holds OpInfo samples bound to other overloads of their packet, not
    yet checked against those overloads (checking runs meta kernels: see :func:`samples_for`)."""

    def __init__(self):
        self.by_op: dict = defaultdict(list)
        self.candidates: dict = defaultdict(list)
        self.recorded: dict = defaultdict(list)  # calls decompositions made of the op
        self._seen: dict = defaultdict(set)
        self._seen_recorded: dict = defaultdict(set)

    def full(self, op) -> bool:
        return len(self.by_op[op]) >= PER_OP

    def add(self, op, args, kwargs, source) -> bool:
        if self.full(op):
            return False
        try:
            args, kwargs = tree_map(snapshot, (tuple(args), dict(kwargs)))
        except _Unusable:
            return False
        sig = _signature(args, kwargs)
        if sig in self._seen[op]:
            return False
        self._seen[op].add(sig)
        self.by_op[op].append(Sample(args, kwargs, source))
        return True

    def add_recorded(self, op, args, kwargs) -> bool:
        """Keep a call a decomposition made of ``op`` (at most :data:`RECORDED_PER_OP` of
        different kinds); True when new."""
        sig = _kind(args, kwargs)
        if len(self.recorded[op]) >= RECORDED_PER_OP or sig in self._seen_recorded[op]:
            return False
        self._seen_recorded[op].add(sig)
        self.recorded[op].append(Sample(args, kwargs, "recorded"))
        return True

    @classmethod
    def from_opinfo(cls, wanted, names=None, bar=None) -> Pool:
        """Run PyTorch's OpInfo samples (those whose name is in ``names``, or all) under a
        capturing mode; bind each OpInfo's samples to the ``wanted`` overloads of its packet.
        ``bar`` (a :class:`~eagerdecomp.coverage.workers.ProgressBar`) counts the OpInfos run."""
        pool = cls()
        with quiet(), torch.random.fork_rng():
            torch.manual_seed(0)
            _from_opinfo(pool, set(wanted), names, bar)
        return pool


class _Capture(TorchDispatchMode):
    """Records every aten call that reaches it, then runs it."""

    def __init__(self, samples: Pool, source: str = "opinfo"):
        super().__init__()
        self.samples, self.source = samples, source

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "aten" and not self.samples.full(func):
            with torch.no_grad():
                self.samples.add(func, args, kwargs, self.source)
        return func(*args, **kwargs)


@contextlib.contextmanager
def quiet():
    """Silence what probing thousands of ops prints: warnings, and FakeTensor's error log."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def fake_args(mode: FakeTensorMode, args, kwargs):
    """``(args, kwargs)`` with every tensor replaced by a fake copy in ``mode``."""
    return tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))


def _runs(op, args, kwargs, real: bool = False) -> bool:
    """True when ``op``'s own kernel accepts these arguments (checked on fake tensors, then,
    with ``real``, on copies of the real ones: meta kernels do not check everything, dtypes
    in particular)."""
    fake = _runs_fake(op, args, kwargs)
    if fake is False or (fake and not real):
        return bool(fake)
    try:
        copies, kwcopies = tree_map(snapshot, (tuple(args), dict(kwargs)))
        op(*copies, **kwcopies)
        return True
    except Exception:  # noqa: BLE001
        return False


def _runs_fake(op, args, kwargs):
    """True, False, or None when the op has no meta kernel (only a real run can tell)."""
    # NOTE: no fallback to the real kernel on zero-filled tensors: on guessed arguments
    # an op without a meta kernel can crash the process (seen: a segfault).
    mode = FakeTensorMode(allow_fallback_kernels=False)
    try:
        fargs, fkwargs = fake_args(mode, args, kwargs)
        with mode:
            op(*fargs, **fkwargs)
        return True
    except UnsupportedOperatorException:
        return None
    except Exception:  # noqa: BLE001 - any rejection means: not a sample of this op
        return False


def _opinfo_dtype(info):
    dtypes = info.supported_dtypes("cpu")
    if torch.float32 in dtypes:
        return torch.float32
    return min(dtypes, key=str) if dtypes else None


def _run_opinfo(info, dtype, samples: Pool, bound: list) -> None:
    grad = bool(info.supports_autograd) and dtype.is_floating_point
    for s in itertools.islice(info.sample_inputs("cpu", dtype, requires_grad=grad), PER_OPINFO):
        bound.append(s)
        with _Capture(samples):
            out = info.op(s.input, *s.args, **s.kwargs)
            if not grad:
                continue
            outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            ins = [
                i for i in tree_leaves((s.input, s.args, s.kwargs)) if isinstance(i, torch.Tensor) and i.requires_grad
            ]
            if outs and ins:
                torch.autograd.grad(outs, ins, [torch.ones_like(o) for o in outs], allow_unused=True)


def _packet_overloads(name: str) -> list:
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in packet.overloads()]


def _detached(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _sdpa_4d(causal: bool, kv_heads: int):
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 7, 8, requires_grad=True) for _ in range(2))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != 4)
    torch.autograd.grad(out.sum(), (q, k, v))


def _grouped_mm(dtype):
    a = torch.randn(32, 16, dtype=dtype)
    b = torch.randn(4, 16, 16, dtype=dtype).transpose(-2, -1)  # the kernel wants 16-byte strides
    torch._grouped_mm(a, b, torch.tensor([8, 16, 24, 32], dtype=torch.int32))
    torch._grouped_mm(a.view(2, 16, 16), b[:2])


# NOTE: ops that only a fused kernel's own autograd (or a model library) calls, with arguments
# no OpInfo sample makes: SDPA's OpInfo samples are 3-d, so they take the math path and never
# reach the 4-d CPU flash kernel and its backward; no OpInfo calls _grouped_mm (MoE layers do).
# Captured like OpInfo samples, so the graph decides these ops instead of calling them undetermined.
_PROGRAMS = (
    lambda: _sdpa_4d(False, 4),
    lambda: _sdpa_4d(True, 4),
    lambda: _sdpa_4d(False, 2),
    lambda: _grouped_mm(torch.float32),
    lambda: _grouped_mm(torch.bfloat16),
)


def _from_programs(pool: Pool) -> None:
    for program in _PROGRAMS:
        try:
            with _Capture(pool, "program"):
                program()
        except Exception:  # noqa: BLE001 - a program this torch cannot run proves nothing
            pass


def _from_opinfo(pool: Pool, wanted, names, bar=None) -> None:
    if names is None:
        _from_programs(pool)
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # noqa: BLE001 - needs expecttest; without it, only derived and synthesized inputs
        return
    infos = [info for info in op_db if names is None or info.name in names]
    if bar is not None:
        bar.start(len(infos), "running OpInfo samples")
    for done, info in enumerate(infos):
        if bar is not None:
            bar.update(done)
        dtype = _opinfo_dtype(info)
        if dtype is None:
            continue
        bound: list = []
        try:
            _run_opinfo(info, dtype, pool, bound)
        except Exception:  # noqa: BLE001 - a sample that fails natively proves nothing
            pass
        packets = {info.aten_name, info.name.replace(".", "_"), info.name.split(".")[-1]}
        for op in (o for n in sorted(filter(None, packets)) for o in _packet_overloads(n) + _packet_overloads(n + "_")):
            if op in wanted:
                for s in bound:
                    pool.candidates[op].append(tree_map(_detached, ((s.input, *s.args), dict(s.kwargs))))
    if bar is not None:
        bar.update(len(infos))


# -- derived: in-place and out= overloads from their functional overload ---------------------


def _out_args(op):
    return [a for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def _derive(op, functional, pool: Pool) -> None:
    outs = _out_args(op)
    for s in list(pool.by_op.get(functional, ())):
        kwargs = dict(s.kwargs)
        if outs:
            try:
                with torch.no_grad():
                    result = functional(*s.args, **s.kwargs)
            except Exception:  # noqa: BLE001
                continue
            results = [r for r in tree_leaves(result) if isinstance(r, torch.Tensor)]
            if len(results) != len(outs):
                continue
            for a, r in zip(outs, results):
                kwargs[a.name] = torch.empty(0, dtype=r.dtype)
        if _runs(op, s.args, kwargs, real=True):
            pool.add(op, s.args, kwargs, "derived")


# -- synthesized from the schema --------------------------------------------------------------

# NOTE: square matrices (3, 3), (2, 3, 3) let matmul-like ops (addmm, bmm, baddbmm) accept
# one shape for every tensor argument
_SHAPES = [(2, 3), (3,), (3, 3), (2, 3, 3), (1, 2, 4, 4), (2, 2, 3, 3, 3), ()]
_DTYPES = [torch.float32, torch.int64, torch.bool]

# list arguments by name: values that make most shape-taking ops valid
# (size/shape/stride follow the tensor shape being tried)
_LIST_BY_NAME = {
    "dim": [0],
    "dims": [0],
    "perm": [1, 0],
    "padding": [0],
    "output_padding": [0],
    "dilation": [1],
    "kernel_size": [1],
    "output_size": [1],
}
_INT_BY_NAME = {"dim": 0, "groups": 1, "padding_idx": -1, "ignore_index": -100, "reduction": 1, "start": 0}


class _NoSynthesis(Exception):
    pass


_STR_BY_NAME = {"reduce": "sum", "reduction": "mean", "approximate": "none", "indexing": "ij", "mode": "reflect"}
_PLAIN_VALUES = {
    "int": 1,
    "float": 0.5,
    "bool": False,
    "ScalarType": torch.float32,
    "Layout": torch.strided,
    "Device": torch.device("cpu"),
    "MemoryFormat": torch.contiguous_format,
}


def _synth_value(name: str, typ: str, n, shape, dtype):
    """A value of schema type ``typ`` (``Tensor``, ``Optional[int]``, ``List[Tensor]``...)."""
    if typ.startswith("Optional["):
        inner = typ[len("Optional[") : -1]
        # NOTE: an optional list of tensors is how indices are passed (index.Tensor): give one
        return _synth_value(name, inner, n, shape, dtype) if inner.startswith("List[") else None
    if typ.startswith("List["):
        inner = typ[len("List[") : -1]
        if inner == "int":
            if name in ("size", "shape"):
                return list(shape)
            if name == "stride":
                return list(torch.empty(shape).stride())
            value = _LIST_BY_NAME.get(name, [1])
            return (value * n)[:n] if n else value
        if inner in ("Tensor", "Optional[Tensor]"):
            index_like = inner != "Tensor"
            return [torch.zeros(shape, dtype=torch.int64 if index_like else dtype)] * (1 if index_like else 2)
        return [_synth_value(name, inner, None, shape, dtype)] * (n or 1)
    if typ == "Tensor":
        return torch.zeros(shape, dtype=dtype)
    if typ == "int":
        return _INT_BY_NAME.get(name, 1)
    if typ == "number":
        return 2.0 if dtype.is_floating_point else 2
    if typ == "str" and name in _STR_BY_NAME:
        return _STR_BY_NAME[name]
    if typ in _PLAIN_VALUES:
        return _PLAIN_VALUES[typ]
    raise _NoSynthesis(f"cannot make a value of type {typ} (argument {name!r})")


def _synthesize(op, samples: Pool) -> str | None:
    """Try schema-made arguments; returns why none worked, or None on success."""
    required = [a for a in op._schema.arguments if not a.has_default_value()]
    outs = [a for a in required if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only]
    try:
        for shape, dtype in itertools.product(_SHAPES, _DTYPES):
            args, kwargs = [], {}
            for a in required:
                if a in outs:  # an empty out= tensor: the op resizes it without a warning
                    value = (
                        [torch.empty(0, dtype=dtype)] * (a.N or 1)
                        if "List" in str(a.type)
                        else torch.empty(0, dtype=dtype)
                    )
                else:
                    value = _synth_value(a.name, str(a.real_type), a.N, shape, dtype)
                if a.kwarg_only:
                    kwargs[a.name] = value
                else:
                    args.append(value)
            if _runs(op, args, kwargs, real=True):
                samples.add(op, args, kwargs, "synthesized")
                return None
    except _NoSynthesis as e:
        return str(e)
    return "no schema-made input was accepted by the op's own kernel"


def samples_for(op, pool: Pool) -> tuple:
    """``([Sample], why_none)`` for ``op``: checked samples, best source first (see module doc).

    Runs the op's meta kernel on candidate arguments: call it where a crash is survivable.
    """
    with quiet(), torch.random.fork_rng():
        torch.manual_seed(0)
        for args, kwargs in pool.candidates.pop(op, ()):
            if not pool.full(op) and _runs(op, args, kwargs, real=True):
                pool.add(op, args, kwargs, "opinfo-bound")
        functional = functional_variant(op)
        if functional is not None and not pool.full(op):
            if not pool.by_op.get(functional):
                samples_for(functional, pool)
            _derive(op, functional, pool)
        why_none = None
        if not pool.by_op.get(op) and not pool.recorded.get(op):
            why_none = _synthesize(op, pool)
    return list(pool.by_op.get(op, ())) + list(pool.recorded.get(op, ())), why_none
