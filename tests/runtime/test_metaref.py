"""The meta-kernel leg of a reference (runtime/metaref.py) against FakeTensorMode's whole
dispatch, on every aten call the OpInfo database's samples make: the same outputs (sizes,
strides, offset, dtype, device), the same sharing of input memory, the same input objects
returned, the same refusals."""

import itertools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from eagerdecomp.runtime import exact, metaref

aten = torch.ops.aten


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def _layout(o):
    if isinstance(o, torch.Tensor):
        return tuple(o.shape), o.stride(), o.storage_offset(), o.dtype, o.device
    return repr(o)


def _both(func, args, kwargs):
    """(this leg's reference, the whole dispatch's) for one call, each over fresh fakes."""
    tensors = exact.flat_tensors(args, kwargs)
    mode = exact.concrete_fake_mode(tensors)
    with _disable_current_modes():
        fakes = exact.fakes_like(mode, tensors)
        quick = exact.reference(func, args, kwargs, mode, fakes, concrete=True)
        slow_fakes = exact.fakes_like(mode, tensors)
        slow = exact.reference(func, args, kwargs, mode, slow_fakes)
    return (quick, fakes), (slow, slow_fakes)


def _same(a, b) -> str | None:
    (quick, fakes), (slow, slow_fakes) = a, b
    if type(quick) is not type(slow):
        return f"{type(quick).__name__} against {type(slow).__name__}"
    if not isinstance(quick, exact._Ref):
        return None
    if [_layout(o) for o in quick.outs] != [_layout(o) for o in slow.outs]:
        return f"{[_layout(o) for o in quick.outs]} against {[_layout(o) for o in slow.outs]}"
    if quick.shares != slow.shares:
        return f"shares {quick.shares} against {slow.shares}"
    mine = [next((i for i, f in enumerate(fakes) if o is f), None) for o in quick.outs]
    theirs = [next((i for i, f in enumerate(slow_fakes) if o is f), None) for o in slow.outs]
    return None if mine == theirs else f"returns inputs {mine} against {theirs}"


def _calls(dtype, per_op):
    for info in op_db:
        if dtype not in info.supported_dtypes("cpu"):
            continue
        try:
            samples = list(itertools.islice(info.sample_inputs("cpu", dtype), per_op))
        except Exception:  # noqa: BLE001 - a sample generator this build cannot run
            continue
        for s in samples:
            rec = _Calls()
            try:
                with rec:
                    info.op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001 - a sample eager itself refuses
                pass
            for func, args, kwargs in rec.calls:
                tensors = exact.flat_tensors(args, kwargs)
                if metaref.applies(func) and tensors and exact.plain(tensors):
                    yield info.name, func, args, kwargs


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_the_meta_leg_answers_as_the_whole_dispatch(dtype):
    checked, wrong = 0, []
    for name, func, args, kwargs in _calls(dtype, per_op=1):
        checked += 1
        why = _same(*_both(func, args, kwargs))
        if why is not None:
            wrong.append(f"{name}: {func}: {why}")
    assert checked > 500
    assert not wrong, "\n".join(wrong[:20])


def test_ops_the_fake_mode_answers_by_its_own_rules_are_left_to_it():
    assert metaref.applies(aten.add_.Tensor) and metaref.applies(aten.t.default)
    assert not metaref.applies(aten.nonzero.default)  # a data-dependent shape
    assert not metaref.applies(aten.empty_like.default)  # a factory (a device argument)
    assert not metaref.applies(aten.index.Tensor)  # the mode's own rule
    assert not metaref.applies(aten.hardswish.default)  # torch's decomposition over fakes
    assert not metaref.applies(aten.t_.default)  # an in-place view
