"""The reference device itself (csrc/refdev.cpp), without the device switch: its kernels
forward to CPU over the same memory, so storage, views and metadata changes must come
back exactly as on CPU."""

import io

import pytest
import torch
import torch.nn.functional as F

from eagerdecomp import device as device_switch
from eagerdecomp.errors import BackendError

refdev = pytest.importorskip("eagerdecomp.device.refdev")

try:
    DEV = refdev.reference_device()
except BackendError as e:
    pytest.skip(f"reference device unavailable: {e}", allow_module_level=True)


@pytest.fixture(autouse=True)
def strict():
    device_switch.disable(DEV)  # these tests use core ops only, on the device's own kernels
    yield


def ptr(t) -> int:
    return t.untyped_storage().data_ptr()


def test_round_trip_and_device_tags():
    x = torch.randn(3, 4)
    d = x.to(DEV)
    assert d.device == torch.device("edref", 0) and d.is_edref and ptr(d) != ptr(x)
    assert torch.equal(d.cpu(), x)
    assert torch.empty_strided((2, 3), (1, 2), device=DEV).stride() == (1, 2)


def test_core_view_ops_share_the_device_storage():
    x = torch.arange(12.0).reshape(3, 4)
    d = x.to(DEV)
    for fn in (
        lambda t: t.as_strided((2, 2), (1, 4), 1),
        lambda t: t.view(4, 3),
        lambda t: t.permute(1, 0),
        lambda t: t[1],
    ):
        v, vc = fn(d), fn(x)
        assert ptr(v) == ptr(d) and v.device.type == "edref"
        assert (v.shape, v.stride(), v.storage_offset()) == (vc.shape, vc.stride(), vc.storage_offset())
        assert torch.equal(v.cpu(), vc)


def test_copy_between_devices_writes_in_place():
    d = torch.zeros(2, 3).to(DEV)
    src = torch.randn(2, 3)
    assert d.copy_(src) is d and torch.equal(d.cpu(), src)
    back = torch.empty(2, 3)
    assert back.copy_(d) is back and torch.equal(back, src)


def test_resize_grows_the_device_storage_like_cpu():
    x = torch.arange(4.0)
    d = x.to(DEV)
    x.resize_(3, 3)
    assert d.resize_(3, 3) is d
    assert (d.shape, d.stride()) == (x.shape, x.stride())
    assert d.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    assert torch.equal(d.cpu().flatten()[:4], torch.arange(4.0))  # the old data moved along


def test_set_variants_rebind_storage():
    b = torch.arange(6.0).to(DEV)
    a = torch.empty(0).to(DEV)
    assert a.set_(b) is a and ptr(a) == ptr(b) and torch.equal(a.cpu(), b.cpu())
    c = torch.empty(0).to(DEV)
    c.set_(b.untyped_storage(), 2, (2,), (2,))
    assert ptr(c) == ptr(b) and (c.storage_offset(), c.stride()) == (2, (2,))
    assert torch.equal(c.cpu(), torch.tensor([2.0, 4.0]))
    c.set_()
    assert c.shape == (0,) and c.device.type == "edref"


def test_untyped_storage_and_serialization():
    s = torch.UntypedStorage(16, device=DEV)
    assert s.device.type == "edref" and s.nbytes() == 16
    s.resize_(32)
    assert s.nbytes() == 32
    x = torch.randn(5).to(DEV)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    y = torch.load(buf)
    assert y.device.type == "edref" and torch.equal(y.cpu(), x.cpu())


def test_item_and_scalar_operands():
    d = torch.tensor([1.5, 2.5]).to(DEV)
    assert d[1].item() == 2.5
    assert torch.equal((d * torch.tensor(2.0)).cpu(), torch.tensor([3.0, 5.0]))  # 0-dim CPU operand
    assert (d * 2).dtype == torch.float32  # a wrapped Python number promotes as on CPU


def test_op_log_counts_what_ran():
    d = torch.randn(3).to(DEV)
    with refdev.op_log() as ran:
        torch.sigmoid(d)
        torch.sigmoid(d)
    assert ran["sigmoid"] == 2 and set(ran) == {"sigmoid"}


def test_no_kernels_for_composite_implicit_ops():
    # a device kernel for one replaces its composite, autograd included (the gradient is lost)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("aten::upsample_bilinear2d.vec", "aten::var.dim", "aten::avg_pool1d"):
        assert has(name, "CompositeImplicitAutograd") and not has(name, "PrivateUse1"), name


def test_bilinear_upsampling_keeps_its_gradient_with_the_switch():
    import torch.nn.functional as F

    x = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    device_switch.enable(DEV)
    try:
        F.interpolate(xd, scale_factor=2, mode="bilinear").pow(2).sum().backward()
    finally:
        device_switch.disable(DEV)
    F.interpolate(x, scale_factor=2, mode="bilinear").pow(2).sum().backward()
    assert xd.grad is not None
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_enable_warns_of_device_kernels_that_lose_autograd():
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a device kernel for var.dim, as a backend might
    lib.impl("var.dim", lambda *a, **k: None, "PrivateUse1")
    try:
        with pytest.warns(RuntimeWarning, match=r"aten.var.dim.*no gradient"):
            device_switch.enable(DEV)
    finally:
        device_switch.disable(DEV)
        lib._destroy()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::var.dim", "PrivateUse1")


def test_module_to_the_device_keeps_tied_weights_tied():
    # Module.to() swaps each parameter's .data in place where PyTorch calls CPU and the device
    # compatible, as on CUDA; before the device said so, every parameter became a new Parameter
    # and a tied embedding and head (GPT-2's) trained as two (gradients of the tied weight off by 0.37)
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.embed(ids))

    torch.manual_seed(0)
    model = Tied()
    weight = model.embed.weight
    ids = torch.tensor([1, 3, 4])
    model(ids).square().sum().backward()
    expected = weight.grad.clone()
    weight.grad = None
    device_switch.enable(DEV)
    try:
        assert model.to(DEV) is model and model.embed.weight is weight and model.head.weight is weight
        assert weight.device == DEV and len(list(model.parameters())) == 1
        model(ids.to(DEV)).square().sum().backward()
    finally:
        device_switch.disable(DEV)
    torch.testing.assert_close(weight.grad.cpu(), expected)
    assert torch._has_compatible_shallow_copy_type(torch.ones(2).to(DEV), torch.ones(2))


@pytest.mark.parametrize("switch", [False, True])
def test_views_under_inference_mode_follow_their_base(switch):
    # as on CPU: inside inference_mode a view of a normal tensor is a normal tensor (autograd
    # gives it its base's version counter), anything fresh is an inference tensor; the device
    # made every result fresh, and F.linear with a weight from outside failed ("Cannot set
    # version_counter for inference tensor")
    def run(w, x):
        with torch.inference_mode():
            v = w.permute(1, 0)
            y = torch.nn.functional.linear(x, w, w[0])
            return (v.is_inference(), v._base is w, v._version == w._version, y.is_inference()), y

    w, x = torch.randn(3, 3, requires_grad=True), torch.randn(2, 3)
    want, ref = run(w, x)
    if switch:
        device_switch.enable(DEV)
    try:
        got, y = run(w.detach().to(DEV).requires_grad_(), x.to(DEV))
    finally:
        device_switch.disable(DEV)
    assert got == want == (False, True, True, True)
    torch.testing.assert_close(y.cpu(), ref)


# how a program on the device may end: each must exit with status 0
EXIT_SCRIPTS = {
    "load only": "dev = reference_device()",
    "a training step": (
        "dev = reference_device(); ed.enable(dev)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(dev)\n"
        "m(torch.randn(4, 8, device=dev)).logsumexp(-1).sum().backward()"
    ),
    "autograd.grad": (
        "dev = reference_device(); ed.enable(dev)\n"
        "x = torch.ones(3, device=dev, requires_grad=True)\n"
        "torch.autograd.grad(torch.nn.functional.gelu(x).sum(), x)"
    ),
}


def test_programs_on_the_device_exit_cleanly():
    # NOTE: the device's autograd thread keeps the last graph task it ran until the process
    # ends; one holding a Python object, freed during interpreter finalization, aborted the
    # process ("terminate called without an active exception"). It is a race the device thread
    # loses when it is slow to take the GIL, as on a busy machine: with the other core kept
    # busy, nearly every one of these programs aborted before the fix.
    import os
    import subprocess
    import sys

    head = "import torch, eagerdecomp as ed\nfrom eagerdecomp.device.refdev import reference_device\n"
    env = dict(os.environ, EAGERDECOMP_DISK_CACHE="0")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ended = {}
        for name, last in EXIT_SCRIPTS.items():
            r = subprocess.run(
                [sys.executable, "-c", head + last], env=env, capture_output=True, text=True, timeout=300
            )
            ended[name] = (r.returncode, "terminate" in r.stderr)
    finally:
        busy.kill()
    assert ended == {name: (0, False) for name in EXIT_SCRIPTS}


def test_a_lazy_clone_is_copied_when_the_device_writes_it():
    # copy-on-write storage: the first write through either side copies it, as on CPU (the
    # device's copy_ and any other kernel that writes an argument)
    device_switch.enable(DEV)
    try:
        for base in (torch.arange(4), torch.arange(4.0)):
            t = base.to(DEV).view(2, 2)
            c = t._lazy_clone()
            t.view(4).add_(1)  # in place through a view of the original: add, then copy_
            assert torch.equal(c.cpu(), base.view(2, 2)) and torch.equal(t.cpu(), base.view(2, 2) + 1)
            c2 = t._lazy_clone()
            c2.mul_(2)  # and through the clone
            assert torch.equal(t.cpu(), base.view(2, 2) + 1) and torch.equal(c2.cpu(), (base.view(2, 2) + 1) * 2)
            c3 = t._lazy_clone()
            c3.resize_(8)  # a core kernel that writes its argument
            assert torch.equal(t.cpu(), base.view(2, 2) + 1)
    finally:
        device_switch.disable(DEV)


def test_complex_tensors_view_as_real_pairs_on_the_device():
    x = torch.randn(3, 2, dtype=torch.complex64)
    d = x.to(DEV)
    r = torch.view_as_real(d)
    assert r.device == d.device and ptr(r) == ptr(d) and r.dtype == torch.float32
    assert (r.shape, r.stride()) == (torch.view_as_real(x).shape, torch.view_as_real(x).stride())
    assert torch.equal(r.cpu(), torch.view_as_real(x))
    back = torch.view_as_complex(r)
    assert ptr(back) == ptr(d) and torch.equal(back.cpu(), x)
    r[0, 0, 1] = 5.0  # writes through to the complex tensor's memory
    assert d[0, 0].cpu().imag == 5.0


def test_legacy_typed_storages_of_the_device():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated, and still used by old code
        d = torch.arange(3.0).to(DEV)
        assert d.storage_type() is torch.edref.FloatStorage
        s = torch.edref.FloatStorage(4)
        assert s.device == DEV and s.dtype == torch.float32 and len(s) == 4
        assert isinstance(d.storage(), torch.edref.FloatStorage)
        assert not isinstance(torch.arange(3.0).storage(), torch.edref.FloatStorage)


def test_autocast_on_the_device_follows_pytorchs_shared_policy():
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    dx, dw = x.to(DEV), w.to(DEV)
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEV.type)
        y = F.linear(dx, dw)  # lower-precision list
        e = torch.exp(dx.to(torch.bfloat16))  # float32 list
        s = dx + 1  # neither: untouched
    assert (y.dtype, e.dtype, s.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert torch.equal(y.cpu(), F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)))
    assert torch.equal(e.cpu(), torch.exp(x.to(torch.bfloat16).float()))


def test_physical_conjugation_on_the_device_through_complex_views():
    device_switch.enable(DEV)
    try:
        for dtype in (torch.complex64, torch.complex128):
            x = torch.randn(3, 4, dtype=dtype)
            for t, d in ((x, x.to(DEV)), (x.t(), x.to(DEV).t())):
                got = torch.conj_physical(d)
                want = torch.conj_physical(t)
                assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
                out = torch.empty(0, dtype=dtype, device=DEV)
                assert torch.conj_physical(d, out=out) is out and torch.equal(out.cpu(), want)
            y = x.to(DEV).conj()  # a conjugate view, resolved when copied
            assert y.is_conj() and torch.equal(torch.empty_like(y).copy_(y).cpu(), x.conj())
    finally:
        device_switch.disable(DEV)


def test_torch_compile_with_the_default_backend_runs_on_edref():
    # edref's memory is host memory: its device module offers Inductor CPU's code generators,
    # so Inductor lowers (aten.mean.dim included) instead of raising LoweringException
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU())
    x = torch.randn(3, 8)
    want = model(x).mean(dim=1)
    on_dev = copy.deepcopy(model).to(DEV)
    device_switch.enable(DEV)  # what Inductor leaves to kernels (addmm.out) runs through the switch
    try:
        got = torch.compile(lambda t: on_dev(t).mean(dim=1))(x.to(DEV))
    finally:
        device_switch.disable(DEV)
        torch._dynamo.reset()
    assert got.device == DEV and (got.dtype, got.shape) == (want.dtype, want.shape)
    torch.testing.assert_close(got.cpu(), want)  # compiled code rounds as it fuses, not bitwise
    from torch._inductor.codegen.common import get_scheduling_for_device

    assert get_scheduling_for_device(DEV.type) is not None
