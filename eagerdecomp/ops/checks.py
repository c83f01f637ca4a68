"""Eager's argument checks that neither PyTorch's decompositions nor its meta kernels make.

Before a call is decomposed (traced, or lowered eagerly) the runtime asks the op's meta
kernel (:func:`eagerdecomp.exact.reference` with ``refuse=True``) and then this table, so
that a decomposition never computes a result for arguments eager refuses. Each entry
raises eager's error type with eager's message. The table is keyed by overload; an entry
registered for a packet covers every overload (in-place and ``out=`` ones included).

Example::

    >>> import torch, eagerdecomp as ed
    >>> x = torch.ones(1, 1, 4, 4, dtype=torch.int32)
    >>> with ed.EagerDecompMode("core_aten"):
    ...     torch.nn.functional.interpolate(x, scale_factor=2.0)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    NotImplementedError: "upsample_nearest2d" not implemented for 'Int'
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._prims_common import alert_not_deterministic
from torch.utils._python_dispatch import _disable_current_modes

from eagerdecomp.ops import overlap
from eagerdecomp.ops.opset import resolve_op
from eagerdecomp.ops.overlap import rules_for
from eagerdecomp.ops.schema import written
from eagerdecomp.ops.variants import functional_variant

__all__ = ["check", "CHECKS", "checks_for", "dtype_check", "alert", "ALERTS", "warn_once", "ONCE", "ONCE_MESSAGES"]

aten = torch.ops.aten
CHECKS: dict = {}  # OpOverload -> fn(*args, **kwargs) raising eager's error, or returning None


def checks_for(*ops):
    """Decorator: ``fn(*args, **kwargs)`` checks calls of ``ops`` (overloads or packets)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            for overload in resolve_op(op):
                if overload in CHECKS:
                    raise ValueError(f"a check for {overload} is already registered")
                CHECKS[overload] = fn
        return fn

    return register


def check(func, args, kwargs) -> None:
    """Raise what eager raises for this call where the table knows it; else nothing.

    NOTE: memory overlap first: eager checks it as it builds its iterator, before any
    dtype or shape check (``x[:-1] <<= x[1:]`` on floats is an overlap error)."""
    if written(func):
        _overlap(func, args, kwargs)
    fn = CHECKS.get(func)
    if fn is not None:
        fn(*args, **kwargs)


def _overlap(func, args, kwargs) -> None:
    functional = functional_variant(func)
    if functional is None:
        return
    rules = rules_for(func, functional)
    if not rules:
        return
    names = written(func)
    dests, inputs = [], []
    for i, a in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        (dests if a.name in names else inputs).append(value)
    try:
        overlap.check(rules, overlap.tensors(dests), overlap.tensors(inputs))
    except RuntimeError:
        if f"{func._schema.name.split('::')[-1]}.{func._overloadname}" in RESIZED_BEFORE_OVERLAP:
            _resize_outs(func, functional, args, kwargs)
        raise


# NOTE: measured as overlap.py's table (torch 2.13, CPU): the out= kernels that resize their out
# to the result's shape (a structured kernel's set_output, with eager's resize warning) before
# they check it for overlap, so eager raises with the out already resized. Others check first
# (TensorIterator builds its operands' overlap before it resizes; index_select, outer, diff...).
# stack.out is left out: with its out among its inputs eager resizes the out twice, the second
# time from the input it has just resized (torch.stack([a, a], out=a), a of shape [4]: [2, 2, 4]).
RESIZED_BEFORE_OVERLAP = frozenset({"cat.out", "kron.out", "gather.out", "take_along_dim.out"})


def _resize_outs(func, functional, args, kwargs) -> None:
    """Resize ``func``'s out= tensors to its result's shape (and strides, where resized) as its
    kernel does before refusing the call: the result's metadata from the functional op on meta
    stand-ins of the arguments."""
    from torch.utils._pytree import tree_flatten, tree_map

    from eagerdecomp.ops.schema import out_args
    from eagerdecomp.ops.variants import resize_out

    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    outs = out_args(func)
    try:
        result = functional(
            *tree_map(meta, list(args)), **{k: tree_map(meta, v) for k, v in kwargs.items() if k not in outs}
        )
    except Exception:  # noqa: BLE001 - eager's kernel refuses these arguments before resizing: nothing to do
        return
    for name, res in zip(outs, tree_flatten(result)[0]):
        out = kwargs.get(name)
        if isinstance(out, torch.Tensor) and out.shape != res.shape:
            resize_out(out, res.shape)
            if out.stride() != res.stride():  # restrided as set_output_raw_strided does
                out.as_strided_(res.shape, res.stride())


# ATen's ScalarType names, which its messages use
_NAMES = {
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def scalar_type_name(dtype) -> str:
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


# NOTE: the dtypes the CPU kernels are instantiated for (AT_DISPATCH); other dtypes raise
# NotImplementedError there, where a decomposition would compute something. Measured on
# torch 2.13 by calling each mode of F.interpolate with every dtype.
_FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_UPSAMPLE_DTYPES = {
    **{
        op: _FLOATING | {torch.uint8}
        for op in (
            aten.upsample_nearest1d,
            aten.upsample_nearest2d,
            aten.upsample_nearest3d,
            aten._upsample_nearest_exact1d,
            aten._upsample_nearest_exact2d,
            aten._upsample_nearest_exact3d,
            aten.upsample_bilinear2d,
            aten.upsample_bicubic2d,
        )
    },
    **{op: _FLOATING for op in (aten.upsample_linear1d, aten.upsample_trilinear3d)},
    **{
        op: frozenset({torch.uint8, torch.float32, torch.float64})
        for op in (aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)
    },
}


def dtype_check(packet, dtypes: frozenset):
    """A check for ``checks_for(packet)``: eager's NotImplementedError (its CPU kernel's own
    message) for an input dtype outside ``dtypes``, the dtypes the CPU kernel is built for."""

    def check_dtype(input, *args, **kwargs):
        if input.dtype not in dtypes:
            _refuse_as_cpu(packet, input, args, kwargs)
            raise NotImplementedError(f"\"{packet.__name__}\" not implemented for '{scalar_type_name(input.dtype)}'")

    return check_dtype


def _refuse_as_cpu(packet, input, args, kwargs) -> None:
    # NOTE: eager's message names the kernel its CPU code path dispatched on, which depends on the
    # layout ("upsample_nearest2d_channels_last", "compute_indices_weights_cubic" for bicubic's
    # weights...). The CPU kernel refuses at dispatch, before reading a value, so running it on an
    # uninitialized stand-in of the input's layout raises eager's own error and message.
    standin = torch.empty_strided(input.shape, input.stride(), dtype=input.dtype)
    with _disable_current_modes():  # (a plain CPU call: no mode of ours, no fake tensors)
        packet(standin, *args, **{k: v for k, v in kwargs.items() if k != "out"})


for _packet, _dtypes in _UPSAMPLE_DTYPES.items():
    checks_for(_packet)(dtype_check(_packet, _dtypes))


@checks_for(aten.elu_backward)
def _elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result, **out):
    # NOTE: the gradient of elu_/celu_ is computed from their result, which a negative alpha
    # makes ambiguous; eager refuses
    if is_result and alpha < 0:
        raise RuntimeError(
            "In-place elu backward calculation is triggered with a negative slope which is not supported. "
            "This is caused by calling in-place forward function with a negative slope, please call "
            "out-of-place version instead."
        )


_LEAKY_IN_PLACE = (
    "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported. "
    "This is caused by calling in-place forward function with a negative slope, please call out-of-place "
    "version instead. File an issue at https://github.com/pytorch/pytorch if you do require supporting "
    "in-place leakRelu backward calculation with negative slope"
)


@checks_for(aten.leaky_relu_backward)
def _leaky_relu_backward(grad_output, self, negative_slope, self_is_result, **out):
    if self_is_result and negative_slope < 0:  # as for elu_ above
        raise RuntimeError(_LEAKY_IN_PLACE)


@checks_for(aten.rrelu_with_noise_backward)
def _rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result, **out):
    # NOTE: out of training eager's kernel is leaky_relu_backward with the mean slope
    if not training and self_is_result and (float(lower) + float(upper)) / 2 < 0:
        raise RuntimeError(_LEAKY_IN_PLACE)


@checks_for(aten.index_fill.int_Scalar, aten.index_fill_.int_Scalar, aten.index_fill.int_Scalar_out)
def _index_fill(self, dim, index, value, **out):
    if isinstance(value, complex) and not self.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")


@checks_for(aten.masked_select)
def _masked_select(self, mask, **out):
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")


@checks_for(aten.logcumsumexp.out)
def _logcumsumexp_out(self, dim, *, out):
    # NOTE: unlike a TensorIterator op, its out= must have the input's dtype
    if out.dtype != self.dtype:
        raise RuntimeError(
            f"expected scalar_type {scalar_type_name(self.dtype)} but found {scalar_type_name(out.dtype)}"
        )


# NOTE: under torch.use_deterministic_algorithms(True) eager's CPU kernels of these ops raise
# (or, with warn_only, warn) that they have no deterministic implementation; the name is the
# one eager's message gives. Checked as the called op is lowered, inside the trace, so a kernel
# traced under warn_only replays the warning on every call (the flags are in every key).
ALERTS = {}  # OpOverload -> fn(*args, **kwargs): the caller name to alert with, or None


def alert(func, args, kwargs) -> None:
    """Eager's nondeterminism alert for this call, where eager's kernel makes one."""
    name = ALERTS.get(func)
    if name is not None and torch.are_deterministic_algorithms_enabled():
        caller = name(*args, **kwargs)
        if caller is not None:
            alert_not_deterministic(caller)  # eager's message; raises, or warns under warn_only


# (max_unpool's alert is made by PyTorch's decomposition itself)
for _op in resolve_op(aten.put_) + resolve_op(aten.put):
    ALERTS[_op] = lambda self, index, source, accumulate=False, **out: None if accumulate else "put_"


# NOTE: eager's kernels of these ops warn once per process (TORCH_WARN_ONCE). The flag is C++'s,
# shared with every native call in the process, and no meta kernel raises the warning (a
# decomposed call never meets it, so it went missing). Running eager's own CPU kernel on a
# one-element stand-in fires the flag's warning exactly when eager would: on the process's
# first such call, native or not, and never again. The runtime raises it for the call, at the
# caller's line (eagerdecomp.runtime.quiet), and never replays it.
ONCE = {}  # OpOverload -> fn(*args, **kwargs): run eager's kernel where this call would warn
ONCE_MESSAGES = []  # the start of each warning they raise (what the runtime catches)


def warn_once(func, args, kwargs) -> None:
    """Fire eager's once-per-process warning for this call, where eager's kernel has one."""
    standin = ONCE.get(func)
    if standin is not None:
        with _disable_current_modes():  # (a plain CPU call: no mode of ours, no fake tensors)
            standin(*args, **kwargs)


def _scatter_reduce(self, dim, index, src, *, reduce, **out):
    # (Tensor src with reduce=: eager's deprecation; a Scalar value_reduce has none)
    x = torch.zeros(1, dtype=self.dtype)
    try:
        x.scatter_(0, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=self.dtype), reduce=reduce)
    except RuntimeError:
        pass  # a reduce eager refuses: the call itself raises eager's error


ONCE_MESSAGES.append("The reduce argument of torch.scatter with Tensor src is deprecated")
for _op in (aten.scatter.reduce, aten.scatter_.reduce, aten.scatter.reduce_out):
    ONCE[_op] = _scatter_reduce
