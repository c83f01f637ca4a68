"""The prims reference device ``edprims``: edref's twin with kernels for the prims_fusion preset.

PrivateUse1 is one dispatch key and this suite's processes register edref
(tests/conftest.py), so every check runs in a fresh process that registers edprims.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eagerdecomp.device import refdev
from eagerdecomp.errors import BackendError
from eagerdecomp.ops.opset import OpSet
from eagerdecomp.runtime import library as _ext

ROOT = Path(__file__).resolve().parents[2]

if _ext.disabled() or _ext.load(build=True) is None:
    pytest.skip("the C++ library is not available: no reference device", allow_module_level=True)


def _run(code: str, timeout: float = 900) -> dict:
    """Run ``code`` in a fresh process; it prints one JSON object as its last line."""
    env = dict(os.environ, EAGERDECOMP_DISK_CACHE="0")
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_kernels_are_the_preset_and_the_runtime_ops():
    ops = refdev.device_ops(refdev.PRIMS_DEVICE_NAME)
    runtime = OpSet(list(refdev.DEVICE_RUNTIME_OPS) + list(refdev.PRIMS_DEVICE_RUNTIME_OPS))
    preset = OpSet.preset("prims_fusion")
    assert set(ops) <= set(preset) | set(runtime)
    assert set(runtime) <= set(ops)
    # every op of the preset a backend can receive (CompositeImplicitAutograd ones never do)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert {op for op in preset if not has(op.name(), "CompositeImplicitAutograd")} <= set(ops)
    assert sum(op.namespace == "prims" for op in ops) > 100


def test_one_reference_device_per_process():
    # this process registered edref (tests/conftest.py): PrivateUse1 is taken
    with pytest.raises(BackendError, match=r"PrivateUse1 already belongs to backend 'edref'.*its own process"):
        refdev.reference_device(refdev.PRIMS_DEVICE_NAME)
    with pytest.raises(BackendError, match=r"unknown reference device 'edfoo'; expected one of"):
        refdev.device_ops("edfoo")


def test_strict_alone_and_trains_the_demo_with_the_switch():
    out = _run(
        """
        import copy, json
        import torch
        import eagerdecomp as ed
        from eagerdecomp.demo import TransformerBlock, train_step, _max_param_diff
        from eagerdecomp.device import refdev
        from eagerdecomp.ops.opset import OpSet, PRIMS_LIBRARY_OPS
        from eagerdecomp.testing import prims_reference_device

        dev = prims_reference_device()
        res = {"device": str(dev)}
        torch.manual_seed(0)
        cpu = TransformerBlock(dropout=0.0)
        ours = copy.deepcopy(cpu).to(dev)
        x, y = TransformerBlock.batch()
        try:  # strict: without the switch, the first op it lacks is PyTorch's own error
            ours(x.to(dev))
            res["strict"] = None
        except NotImplementedError as e:
            res["strict"] = str(e).splitlines()[0]
        try:
            ed.enable(dev, "core_aten")
            res["core_refused"] = None
        except ed.errors.BackendError as e:
            res["core_refused"] = str(e)
        ed.enable(dev, "prims_fusion")
        opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
        opt_d = torch.optim.AdamW(ours.parameters(), lr=1e-2)
        res["loss"], res["logits"], res["grads"] = [], [], []
        with refdev.op_log() as ran:
            for _ in range(2):
                lc, lossc, gc = train_step(cpu, opt_c, x, y)
                ld, lossd, gd = train_step(ours, opt_d, x.to(dev), y.to(dev))
                res["loss"].append(abs(lossd.cpu() - lossc).item())
                res["logits"].append((ld.cpu() - lc).abs().max().item())
                rel = [(a.cpu() - b).abs().max() / b.abs().max().clamp_min(1e-12) for a, b in zip(gd, gc)]
                res["grads"].append(max(r.item() for r in rel))

        class OnHost:  # the device model's parameters on the host, for _max_param_diff
            def parameters(self):
                return [p.detach().cpu() for p in ours.parameters()]

        res["param_diff"] = _max_param_diff(cpu, OnHost(), gc)
        res["ran"] = dict(ran)
        res["kernels"] = sorted(n.removeprefix("aten::") for n in refdev.device_ops("edprims").names())
        res["library"] = sorted(str(op) for op in PRIMS_LIBRARY_OPS)
        res["decomposed"] = sorted(r.op for r in ed.device.enabled(dev).report().decomposed)
        ed.disable(dev)
        print(json.dumps(res))
        """
    )
    assert out["device"] == "edprims:0"
    assert out["strict"] and "Could not run 'aten::" in out["strict"] and "'edprims' backend" in out["strict"]
    assert "the opset core_aten claims" in out["core_refused"]
    assert max(out["loss"]) < 1e-5 and max(out["logits"]) < 1e-4 and max(out["grads"]) < 1e-3
    assert out["param_diff"] < 1e-4
    # the device's own witness: only its kernels ran, and most calls were prims
    ran = out["ran"]
    assert set(ran) <= set(out["kernels"]), sorted(set(ran) - set(out["kernels"]))
    prims = sum(n for name, n in ran.items() if name.startswith("prims::"))
    assert prims > sum(ran.values()) / 2  # the rest: copy_ of in-place writes, library and runtime ops
    assert {"mm", "bmm"} <= set(ran)  # the library ops a fusion compiler keeps arrive as themselves
    assert {"aten.addmm.default", "aten.gelu.default", "aten.native_layer_norm_backward.default"} <= set(
        out["decomposed"]
    )


def test_random_factories_draw_eager_numbers_on_the_device():
    # prims.normal and prims.uniform run on the device through their BackendSelect kernels
    # (empty + normal_ / uniform_): randn on edprims was a cycle (randn -> prims.normal ->
    # normal_ -> its decomposition prims.normal -> ...) until normal_ became a runtime op
    out = _run(
        """
        import json
        import torch
        import eagerdecomp as ed
        from eagerdecomp.testing import prims_reference_device

        dev = prims_reference_device()
        ed.enable(dev)
        calls = {
            "randn": lambda d: torch.randn(3, 4, device=d),
            "randn complex": lambda d: torch.randn(5, dtype=torch.complex64, device=d),
            "normal_": lambda d: torch.empty(3, 5, device=d).normal_(2.0, 3.0),
            "normal_ transposed": lambda d: torch.empty(5, 7, device=d).t().normal_(),
            "uniform_": lambda d: torch.empty(6, device=d, dtype=torch.float64).uniform_(-1.0, 2.0),
            "init.normal_": lambda d: torch.nn.init.normal_(torch.empty(4, 4, device=d)),
            "init.trunc_normal_": lambda d: torch.nn.init.trunc_normal_(torch.empty(8, device=d)),
            # (torch's in-place ref drew a uniform in the tensor's dtype: refused for integers)
            "geometric_ int32": lambda d: torch.empty(6, dtype=torch.int32, device=d).geometric_(0.3),
            "geometric_": lambda d: torch.empty(6, device=d).geometric_(0.3),
        }
        res = {}
        for name, call in calls.items():
            torch.manual_seed(7)
            want = call("cpu")
            torch.manual_seed(7)
            got = call(dev).cpu()
            res[name] = [torch.equal(got, want), got.dtype == want.dtype, got.stride() == want.stride()]
        print(json.dumps(res))
        """
    )
    assert out == {name: [True, True, True] for name in out} and len(out) == 9, out


def test_a_view_leaves_a_lazily_cloned_storage_shared_and_a_write_copies_it():
    # view lowers to prims.as_strided, whose schema marks its input written (Tensor(a!)): the
    # device copied a copy-on-write storage at every view (PyTorch's test_lazy_clone_view)
    out = _run(
        """
        import json
        import torch
        import eagerdecomp as ed
        from eagerdecomp.testing import prims_reference_device

        dev = prims_reference_device()
        ed.enable(dev)
        t = torch.tensor([[0.0, 1.0], [2.0, 3.0]], device=dev)
        ptr = torch._C._data_address(t)
        clone = t._lazy_clone()
        view = t.view([4])
        s = t + 1  # (a binary op reads: no copy either)
        res = {
            "cow": [torch._C._is_cow_tensor(x) for x in (t, view, clone)],
            "shared": [torch._C._data_address(x) == ptr for x in (t, view, clone)],
        }
        view.add_(10)  # a write copies the storage first: the clone keeps its values
        res["after"] = [t.cpu().tolist(), clone.cpu().tolist(), s.cpu().tolist()]
        res["clone_ptr"] = torch._C._data_address(clone) == ptr
        print(json.dumps(res))
        """
    )
    assert out["cow"] == [True, True, True] and out["shared"] == [True, True, True], out
    assert out["after"] == [[[10.0, 11.0], [12.0, 13.0]], [[0.0, 1.0], [2.0, 3.0]], [[1.0, 2.0], [3.0, 4.0]]], out
