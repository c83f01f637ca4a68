"""The routing table (eagerdecomp/routes.py): collectives and infrastructure pass through
untouched, everywhere eagerdecomp routes ops (the mode, the lowering, the compile backend,
the device switch). Collectives here run on PyTorch's in-process "fake" process group;
tests/device/test_distributed.py runs real ones."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.dynamo.backend import compile_backend
from eagerdecomp.errors import BackendError
from eagerdecomp.runtime import routes
from eagerdecomp.testing import RecordingMode

try:
    from eagerdecomp.device.refdev import reference_device

    DEV = reference_device()
except BackendError:
    DEV = None

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


@pytest.fixture
def fake_group():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_every_collective_namespace_is_in_the_table():
    # a namespace torch adds for process-group work must get a row (and a reason) here
    namespaces = {n.partition("::")[0] for n in torch._C._dispatch_get_all_op_names()}
    collective = {ns for ns in namespaces if "c10d" in ns or ns in ("_dtensor", "symm_mem")}
    assert collective and collective <= set(routes.NAMESPACES)
    for ns, route in routes.NAMESPACES.items():
        assert route.name in (routes.COMMUNICATION, routes.INFRASTRUCTURE) and route.reason
        if route.name == routes.COMMUNICATION:  # (prim:: ops live in TorchScript, not the dispatcher)
            assert ns in namespaces, f"{ns} has no registered op"


def test_collectives_pass_through_the_mode(fake_group):
    x = torch.randn(6)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten") as mode:
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        y = funcol.all_reduce(F.silu(x), "sum", fake_group) + 1  # functional: all_reduce + wait_tensor
    assert y.shape == x.shape
    assert rec.outside("core_aten") == []
    seen = rec.collectives()
    assert {"c10d.allreduce_.default", "c10d.broadcast_.default", "_c10d_functional.all_reduce.default"} <= set(seen)
    rows = {r.op: r for r in mode.report().rows}
    for op in seen:
        assert rows[op].route == routes.COMMUNICATION and rows[op].routed == {routes.COMMUNICATION: rows[op].calls}
    assert rows["aten.silu.default"].route == "decomposed"


def test_compiled_graphs_keep_functional_collectives(fake_group):
    torch._dynamo.reset()
    be = compile_backend("core_aten")
    fn = torch.compile(lambda t: funcol.all_reduce(F.silu(t), "sum", fake_group) * 2, backend=be, fullgraph=True)
    assert fn(torch.randn(5)).shape == (5,)
    ops = {str(op) for op in be.ops()}
    assert "_c10d_functional.all_reduce.default" in ops and "aten.silu.default" not in ops
    assert be.outside_opset() == []


def test_infrastructure_is_not_reported_outside_the_opset():
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        with torch.profiler.record_function("step"):
            F.silu(torch.randn(3))
    assert any(op.namespace == "profiler" for op in rec.ops) and rec.outside("core_aten") == []


@pytest.mark.skipif(DEV is None, reason="reference device unavailable")
def test_a_collective_the_device_backend_lacks_is_a_clear_error():
    device_switch.disable(DEV)
    device_switch.enable(DEV)
    try:
        # c10d::check_for_nan has a CPU kernel only, so on edref it reaches the device switch
        with pytest.raises(BackendError, match=r"c10d.check_for_nan.*register_backend\(.*devices=\['edref'\]"):
            torch.ops.c10d.check_for_nan(torch.ones(3).to(DEV))
    finally:
        device_switch.disable(DEV)
