"""A process-group backend for the reference device: collectives of ``edref`` tensors run on gloo.

This is the piece a device team adds so that ``torch.distributed`` (DDP, FSDP2,
DTensor) works on their device: a backend registered for the device type with
``torch.distributed.Backend.register_backend(name, creator, devices=[device])``
and named in ``init_process_group``. A real device wraps its own collective
library; edref's memory is host memory, so its backend runs gloo on that memory
itself: a CPU view of each contiguous ``edref`` tensor (``host_view`` in
``csrc/refdev.cpp``), a host copy only for a non-contiguous one (gloo needs
dense buffers) or a C++ library built before ``host_view``. eagerdecomp's part is only that
collectives pass through untouched (:mod:`eagerdecomp.routes`); a collective
this backend lacks raises :class:`~eagerdecomp.errors.BackendError` naming it.

Example (each rank)::

    import torch.distributed as dist
    from eagerdecomp import refdev_dist
    dev = refdev_dist.register()                      # loads edref, registers the backend
    dist.init_process_group(refdev_dist.BACKEND, init_method="tcp://127.0.0.1:29500",
                            rank=rank, world_size=2)
    ed.enable(dev)
    ddp = DistributedDataParallel(model.to(dev))      # allreduce/broadcast of edref buckets
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from eagerdecomp.device.refdev import DEVICE_NAME, reference_device
from eagerdecomp.errors import BackendError
from eagerdecomp.runtime import library as _ext

__all__ = ["BACKEND", "EdrefProcessGroup", "register", "COLLECTIVES"]

BACKEND = "edref_gloo"

# What the backend implements, and for whom (the collectives DDP, dist.* and this module's
# tests need); every other ProcessGroup method raises BackendError naming it.
COLLECTIVES = {
    "allreduce": "DDP's gradient buckets, dist.all_reduce",
    "broadcast": "DDP's initial parameter sync, dist.broadcast",
    "allgather": "DDP's parameter-shape check at construction, dist.all_gather",
    "barrier": "dist.barrier",
}
_LACKING = (
    "allreduce_coalesced",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "_allgather_base",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "gather",
    "scatter",
    "alltoall",
    "alltoall_base",
    "send",
    "recv",
    "recv_anysource",
    "monitored_barrier",
)


def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME


def _host(t):
    """``t`` as gloo can take it: itself (CPU), a view of its memory, or a copy (then written back)."""
    if not _on_device(t):
        return t
    view = getattr(_ext.load(), "host_view", None)
    return view(t) if view is not None and t.is_contiguous() else t.cpu()


def _write_back(tensor_lists, host_lists) -> None:
    for ts, hs in zip(tensor_lists, host_lists):
        for t, h in zip(ts, hs):
            if t is not h and t.untyped_storage().data_ptr() != h.untyped_storage().data_ptr():
                t.copy_(h)  # a staged copy; a view already wrote the device memory


def _done(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


class EdrefProcessGroup(dist.ProcessGroup):
    """Runs each collective on a gloo group, over the host memory of ``edref`` tensors.

    The returned work is complete and its result is the caller's own tensors (DDP's reducer
    reads its gradients back from it). ``calls`` counts the collectives run, by name: the
    backend's own witness that the device's collectives reached it.
    """

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.calls: Counter = Counter()

    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return BACKEND

    def name(self) -> str:
        return BACKEND

    # Each collective: the device tensors as host tensors, gloo, staged copies written back.
    def _run(self, method: str, tensor_lists: list, *rest):
        self.calls[method] += 1
        host = [[_host(t) for t in ts] for ts in tensor_lists]
        getattr(self._gloo, method)(*host, *rest).wait()
        _write_back(tensor_lists, host)
        return _done(tensor_lists[0])

    def allreduce(self, tensors, opts=None):
        return self._run("allreduce", [tensors], opts or dist.AllreduceOptions())

    def broadcast(self, tensors, opts=None):
        return self._run("broadcast", [tensors], opts or dist.BroadcastOptions())

    def allgather(self, output_lists, inputs, opts=None):
        self.calls["allgather"] += 1
        host_out = [[_host(t) for t in ts] for ts in output_lists]
        self._gloo.allgather(host_out, [_host(t) for t in inputs], opts or dist.AllgatherOptions()).wait()
        _write_back(output_lists, host_out)
        return _done(output_lists)

    def barrier(self, opts=None):
        self.calls["barrier"] += 1
        self._gloo.barrier(opts or dist.BarrierOptions()).wait()
        return _done([])


def _lacking(method: str):
    def refuse(self, *args, **kwargs):
        raise BackendError(
            f"{method}: the {BACKEND!r} process-group backend of device {DEVICE_NAME!r} does not implement "
            f"this collective; expected one of {sorted(COLLECTIVES)}. Implement it in "
            f"eagerdecomp.device.refdev_dist.EdrefProcessGroup (hand gloo the tensors' host views) or register "
            f"another backend for the device."
        )

    refuse.__name__ = method
    return refuse


for _method in _LACKING:
    setattr(EdrefProcessGroup, _method, _lacking(_method))


def _create(store, rank, size, timeout):
    return EdrefProcessGroup(store, rank, size, timeout)


def register() -> torch.device:
    """Load the reference device and register :data:`BACKEND` for it and for CPU (idempotent).

    NOTE: torch makes a Python ``ProcessGroup`` returned by a creator the whole group, so
    this backend serves CPU tensors too (straight to gloo); ``init_process_group(BACKEND)``.
    """
    dev = reference_device()
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", DEVICE_NAME])
    return dev
