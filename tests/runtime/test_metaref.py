"""The meta-kernel leg of a reference (runtime/metaref.py) against FakeTensorMode's whole
dispatch, on every aten call the OpInfo database's samples make: the same outputs (sizes,
strides, offset, dtype, device), the same sharing of input memory, the same input objects
returned, the same refusals."""

import itertools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

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
    assert metaref._leg(aten.hardswish.default) == "decomposition"  # torch's, over fakes
    assert not metaref.applies(aten.t_.default)  # an in-place view


# (op, arguments): calls whose decompositions emit views, in-place writes, reductions,
# type promotion and several outputs
_TRACED = {
    "addcmul_": (aten.addcmul_.default, lambda: (torch.randn(5, 7), torch.randn(5, 7), torch.randn(7, 5).t())),
    "silu_backward": (aten.silu_backward.default, lambda: (torch.randn(4, 6), torch.randn(4, 6))),
    "split": (aten.split.Tensor, lambda: (torch.randn(5, 7), 2)),
    "log_softmax_backward": (
        aten._log_softmax_backward_data.default,
        lambda: (torch.randn(3, 8), torch.randn(3, 8), 1, torch.float32),
    ),
    "nll_loss_forward": (
        aten.nll_loss_forward.default,
        lambda: (torch.randn(4, 3), torch.tensor([0, 2, 1, 2]), None, 1, -100),
    ),
    "sdpa": (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        lambda: tuple(torch.randn(1, 2, 5, 4) for _ in range(3)),
    ),
}


@pytest.mark.parametrize("name", list(_TRACED))
def test_a_trace_through_the_meta_leg_is_the_trace_through_the_whole_dispatch(name, monkeypatch):
    from eagerdecomp.decompositions.table import default_table
    from eagerdecomp.ops.opset import OpSet
    from eagerdecomp.runtime.key import make_key
    from eagerdecomp.runtime.lift import _graph_words
    from eagerdecomp.runtime.trace import trace

    func, make = _TRACED[name]
    opset = OpSet.preset("core_aten")
    table = default_table(opset)
    args = make()
    _, tensors = make_key(func, args, {})
    used = []
    real = metaref.applies
    monkeypatch.setattr(metaref, "applies", lambda f: used.append(f) or real(f))
    quick = trace(func, args, {}, tensors, opset, table)
    monkeypatch.setattr(metaref, "applies", lambda f: False)
    whole = trace(func, args, {}, tensors, opset, table)
    assert any(real(f) for f in used)  # the meta leg served some of the trace's ops
    assert _graph_words(quick.graph) == _graph_words(whole.graph)
    assert quick.warnings == whole.warnings and quick.constants.keys() == whole.constants.keys()
    for a, b in zip(*(tree_flatten(k([t.clone() for t in tensors]))[0] for k in (quick, whole))):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype
