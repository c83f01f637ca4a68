"""Storage-level idioms under the mode: copy.deepcopy (EMA models), AveragedModel, torch.save and
torch.load, pickling, share_memory_ and DataLoader workers' shared batches.

They rebuild tensors with ``set_``, a runtime op of every preset (``RUNTIME_EXTRAS``). Each idiom
runs natively and under the mode with an independent :class:`RecordingMode` outside it, and the
results are compared with everything eager guarantees: values, dtypes, shapes, strides, storage
offsets, which tensors share a storage, and which are Parameters.
"""

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

import eagerdecomp as ed
from eagerdecomp.ops.opset import RUNTIME_EXTRAS
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten

SET_FAMILY = [
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Tensor,
    aten.set_.source_Tensor_storage_offset,
    aten.set_.default,
]

# a backend's own opset built from a preset (here with an op its library has): it keeps the runtime extras
CUSTOM = ed.OpSet.preset("core_aten") | [aten.silu.default]
OPSETS = {"core_aten": "core_aten", "prims": "prims", "prims_fusion": "prims_fusion", "custom": CUSTOM}


def _model():
    torch.manual_seed(0)
    # BatchNorm's buffers (running stats, num_batches_tracked) are what EMA copies must carry
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def _tensors(obj) -> list:
    """Every tensor in ``obj`` (modules by their state dict and parameters), in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, nn.Module):
        return list(obj.parameters()) + list(obj.buffers())
    if isinstance(obj, dict):
        return [t for k in obj for t in _tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    return []


def _sharing(tensors) -> list:
    """Which tensors share a storage: for each tensor, the index of the first that shares it."""
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    return [ptrs.index(p) for p in ptrs]


def assert_same(got, want):
    g, w = _tensors(got), _tensors(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert type(a) is type(b)
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == (b.dtype, b.shape, b.stride(), b.storage_offset())
        assert a.requires_grad == b.requires_grad
        torch.testing.assert_close(a, b)  # (copies are exact; the EMA and SWA arithmetic to rounding)
    assert _sharing(g) == _sharing(w)


def run_both(fn, opset):
    """``fn()`` natively and under the mode (witnessed): both results, and the mode's report."""
    want = fn()
    with RecordingMode() as rec, ed.EagerDecompMode(opset) as mode:
        got = fn()
    rec.assert_only(opset)
    return got, want, mode.report()


def _save_load(obj, **load):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load)


# -- the set_ family is a runtime op of every preset -----------------------------------------------


@pytest.mark.parametrize("name", list(OPSETS))
def test_set_family_is_in_every_preset_with_its_reason(name):
    opset = ed.OpSet.coerce(OPSETS[name])
    for op in SET_FAMILY:
        assert op in opset, op
        assert len(RUNTIME_EXTRAS[op]) > 20, op


def test_an_opset_without_set_names_it_as_a_runtime_op():
    opset = ed.OpSet.preset("core_aten") - [aten.set_.source_Storage_storage_offset]
    t = torch.randn(3)
    with pytest.raises(ed.UnsupportedOpError, match=r"set_\.source_Storage_storage_offset.*a runtime op every preset"):
        with ed.EagerDecompMode(opset):
            pickle.loads(pickle.dumps(t))


# -- the idioms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPSETS))
def test_deepcopy_of_a_model_with_buffers_then_an_ema_update(name):
    def ema():
        model = _model()
        copied = copy.deepcopy(model)  # timm's ModelEmaV3, most scripts' EMA
        with torch.no_grad():
            for e, m in zip(copied.state_dict().values(), model.state_dict().values()):
                if e.is_floating_point():
                    e.lerp_(m + 1, 0.1)
        return [model, copied]

    got, want, report = run_both(ema, OPSETS[name])
    assert_same(got, want)
    assert all(type(p) is nn.Parameter for p in got[1].parameters())
    assert report.row(aten.set_.source_Storage).route == "passthrough"


@pytest.mark.parametrize("name", list(OPSETS))
def test_averaged_model(name):
    def swa():
        model = _model()
        averaged = torch.optim.swa_utils.AveragedModel(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        averaged.update_parameters(model)
        averaged.update_parameters(model)
        return [model, averaged]

    got, want, _ = run_both(swa, OPSETS[name])
    assert_same(got, want)


@pytest.mark.parametrize("name", list(OPSETS))
@pytest.mark.parametrize(
    "load", [{}, {"map_location": "cpu"}, {"map_location": torch.device("cpu")}, {"map_location": lambda s, loc: s}]
)
def test_checkpoint_save_then_load_of_a_state_dict(name, load):
    def checkpoint():
        model = _model()
        state = _save_load({"model": model.state_dict(), "step": 3}, **load)
        fresh = _model()
        fresh.load_state_dict(state["model"])
        return [state["model"], fresh]

    got, want, _ = run_both(checkpoint, OPSETS[name])
    assert_same(got, want)


@pytest.mark.parametrize("name", list(OPSETS))
def test_save_of_views_keeps_their_storage_shared_after_load(name):
    def views():
        base = torch.arange(24.0).reshape(4, 6)
        loaded = _save_load([base, base[1:3], base.t(), base[:, 2], base.view(24)[5:]])
        loaded[1].mul_(-1)  # a write through one shows in all
        return loaded

    got, want, _ = run_both(views, OPSETS[name])
    assert_same(got, want)
    assert _sharing(got) == [0, 0, 0, 0, 0]


@pytest.mark.parametrize("name", list(OPSETS))
def test_pickle_round_trip_and_reduce_ex(name):
    def round_trip():
        torch.manual_seed(1)
        t = torch.randn(5, 4)[:, 1:3]
        p = nn.Parameter(torch.randn(3))
        ints = torch.arange(6, dtype=torch.int32)
        fn, args = t.__reduce_ex__(2)
        return [pickle.loads(pickle.dumps(x)) for x in (t, p, ints)] + [fn(*args)]

    got, want, _ = run_both(round_trip, OPSETS[name])
    assert_same(got, want)


@pytest.mark.parametrize("name", list(OPSETS))
def test_share_memory(name):
    def share():
        torch.manual_seed(2)
        t = torch.randn(4, 3)
        view = t[1:]
        out = t.share_memory_()
        return [out is t, t.is_shared(), t, view]

    got, want, _ = run_both(share, OPSETS[name])
    assert got[:2] == want[:2] == [True, True]
    assert_same(got[2:], want[2:])


@pytest.mark.parametrize("name", list(OPSETS))
def test_set_overloads_called_directly(name):
    def direct():
        src = torch.arange(12.0)
        a = torch.empty(0).set_(src)
        b = torch.empty(0).set_(src, 2, (2, 3), (3, 1))
        c = torch.empty(0).set_(src.untyped_storage(), 4, (4,), (2,))
        d = torch.empty(0).set_(src.untyped_storage())
        e = torch.ones(3).set_()
        return [src, a, b, c, d, e, a.is_set_to(src)]

    got, want, _ = run_both(direct, OPSETS[name])
    assert got[-1] is want[-1] is True
    assert_same(got[:-1], want[:-1])


@pytest.mark.parametrize("name", list(OPSETS))
def test_worker_style_collate_into_shared_memory(name):
    # what default_collate does in a DataLoader worker: a shared storage, a tensor over it, stack
    def collate():
        torch.manual_seed(3)
        batch = [torch.randn(3, 2) for _ in range(4)]
        storage = batch[0]._typed_storage()._new_shared(sum(x.numel() for x in batch), device="cpu")
        out = batch[0].new(storage).resize_(len(batch), 3, 2)
        return [torch.stack(batch, 0, out=out), out]

    got, want, _ = run_both(collate, OPSETS[name])
    assert_same(got, want)
    assert got[1].is_shared()


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        x = torch.arange(4.0) + i
        return x * x, torch.tensor(i)


def _enter_mode_in_worker(_):
    # the worker process runs its fetches and its collation (into shared memory) under the mode
    rec = RecordingMode()
    rec.__enter__()
    ed.EagerDecompMode("core_aten").__enter__()
    _WORKER["rec"] = rec


_WORKER: dict = {}


def _witnessed_collate(samples):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    batch = torch.utils.data.default_collate(samples)
    return batch, type(_get_current_dispatch_mode()).__name__, _WORKER["rec"].outside("core_aten")


def test_dataloader_workers_collate_shared_batches_under_the_mode():
    native = list(torch.utils.data.DataLoader(_Squares(), batch_size=3, num_workers=2))
    loader = torch.utils.data.DataLoader(
        _Squares(), batch_size=3, num_workers=2, worker_init_fn=_enter_mode_in_worker, collate_fn=_witnessed_collate
    )
    got = list(loader)
    assert len(got) == len(native)
    for (batch, mode, outside), want in zip(got, native):
        assert mode == "EagerDecompMode" and outside == []
        assert_same(batch, want)


# -- the same idioms on a device with the switch (edref: set_ is one of its kernels) -----------------


def assert_same_as_cpu(got, want):
    g, w = _tensors(got), _tensors(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == (b.dtype, b.shape, b.stride(), b.storage_offset())
        torch.testing.assert_close(a.cpu(), b)
    assert _sharing(g) == _sharing(w)


def test_device_deepcopy_averaged_model_and_checkpoints(switched_device):
    dev = switched_device

    def idioms(device):
        model = _model().to(device)
        copied = copy.deepcopy(model)
        averaged = torch.optim.swa_utils.AveragedModel(model)
        averaged.update_parameters(model)
        loaded = _save_load(model.state_dict(), map_location=device)
        return [copied, averaged, loaded]

    got, want = idioms(dev), idioms("cpu")
    assert_same_as_cpu(got, want)
    assert {t.device for t in _tensors(got[0]) + _tensors(got[2])} == {dev}
    # a device checkpoint loads onto the CPU with map_location, and a CPU one onto the device
    state = _save_load(_model().to(dev).state_dict(), map_location="cpu")
    assert_same(state, _model().state_dict())
    assert_same_as_cpu(_save_load(_model().state_dict(), map_location=dev), _model().state_dict())


def test_device_views_pickle_and_set(switched_device):
    dev = switched_device

    def idioms(device):
        base = torch.arange(24.0, device=device).reshape(4, 6)
        views = _save_load([base, base[1:3], base.t()])
        pickled = pickle.loads(pickle.dumps(base[:, 1:4]))
        src = torch.arange(12.0, device=device)
        rebound = torch.empty(0, device=device).set_(src, 2, (2, 3), (3, 1))
        return views + [pickled, src, rebound]

    got = idioms(dev)
    assert {t.device for t in got} == {dev}
    assert_same_as_cpu(got, idioms("cpu"))
