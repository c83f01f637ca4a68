"""Eager's output metadata from the op's meta kernel alone, where that is all a fake tensor does.

A direct call and a trace check their outputs against eager's metadata (:mod:`exact`), taken
from the op's meta kernel run on fake tensors. For most ops at concrete sizes FakeTensorMode
does nothing but run that kernel on the meta tensors inside its fakes and wrap the results on
the inputs' device; the dispatch that decides so (its preamble's checks, its own rules for
~100 ops) was a third of a reference, measured (a ``t``'s 214 -> 136 us, an ``addcmul_``'s
520 -> 421 us). :func:`answer` runs that last leg of FakeTensorMode's dispatch,
its meta kernel call and output wrapping, for the ops where the mode would reach it
(:func:`applies`); anything else, or any error, goes through the mode's whole dispatch. An exact
trace takes the same leg for each opset op it records (an ``addcmul_``'s two stand-in traces,
~5.5 -> ~4.5 ms).
"""

from __future__ import annotations

import functools

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensorMode, in_kernel_invocation_manager, torch_decomp_decompositions
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from eagerdecomp.runtime.quiet import forward, quiet

__all__ = ["applies", "answer"]

# NOTE: ops whose outputs FakeTensorMode makes by a rule of its own, not the meta kernel
_OWN_RULES = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output, torch.Tag.inplace_view)


@functools.cache
def _leg(func) -> str | None:
    """How FakeTensorMode at concrete sizes answers ``func`` on plain fakes when all it does is
    one of two legs (the order of its ``_dispatch_impl``): ``"decomposition"``, torch's
    decomposition run over the fakes, or ``"meta"``, the meta kernel with the outputs wrapped on
    the inputs' device; None for anything else (its own rules, factories, custom kernels)."""
    from torch._decomp import decomposition_table, meta_table

    if type(func) is not OpOverload or func.namespace != "aten" or any(t in func.tags for t in _OWN_RULES):
        return None
    if any("Device" in str(a.type) for a in func._schema.arguments):  # (factories: the device is an argument)
        return None
    cpp_symint = torch.Tag.view_copy in func.tags or func in FakeTensorMode._cpp_meta_supports_symint
    if func not in meta_table and not cpp_symint:
        if func in decomposition_table and torch_decomp_decompositions(func):
            return "decomposition"
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            return None
    if func in fake_impls.op_implementations_dict:
        return None
    if any(check(func) for check, _ in fake_impls.op_implementations_checks):
        return None
    return "meta" if fake_impls.has_meta(func) else None


def applies(func) -> bool:
    """Whether :func:`answer` may stand for FakeTensorMode's dispatch of ``func`` (:func:`_leg`)."""
    return _leg(func) is not None


class _Legs(TorchDispatchMode):
    """Above the fake mode while torch's decomposition runs over fakes: each op it calls takes
    its own leg where it has one, else the fake mode's whole dispatch."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        quick = answer(func, args, kwargs, self.mode) if applies(func) else None
        if quick is None:
            return func(*args, **kwargs)  # (the next mode: the fake mode)
        forward(quick[1])
        return quick[0]


def answer(func, fargs, fkwargs, mode, decompose=True):
    """``(outputs, caught)``: ``func``'s outputs on the fakes ``fargs``/``fkwargs`` of ``mode`` as the
    mode's dispatch would make them, and the warnings :func:`quiet` caught meanwhile; or None
    where the leg raised (the mode's dispatch then decides: eager's error, or no metadata; the
    warnings of the attempt are dropped). ``decompose=False``: the meta leg only.

    NOTE: a trace takes the meta leg only: run inside a trace's own fake mode, torch's
    decomposition of ``native_dropout`` under inference mode returned a fake the trace had not
    recorded (found by the SDPA dropout test)."""
    leg = _leg(func)
    if leg is None or (leg == "decomposition" and not decompose):
        return None
    flat_args = tree_flatten((fargs, fkwargs))[0]
    if any(getattr(a, "constant", None) is not None for a in flat_args):
        return None  # (the mode propagates a constant's value: a decomposition's torch.tensor())
    try:
        with _disable_current_modes(), quiet() as caught:
            if leg == "decomposition":
                from torch._decomp import decomposition_table

                with mode, _Legs(mode):
                    return decomposition_table[func](*fargs, **fkwargs), caught
            with in_kernel_invocation_manager(mode):
                out = func(*fargs, **fkwargs)
            out = mode.wrap_meta_outputs_with_default_device_logic(out, func, flat_args, device=None)
    except Exception:  # noqa: BLE001 - the mode's dispatch runs it again and decides what it means
        return None
    return out, caught
