"""The mode on its C++ dispatch key (eagerdecomp.runtime.keymode): semantics kept.

Each test enters ``EagerDecompMode`` with no Python mode active, so it takes the C++ key path
(asserted first); the witness is :class:`~eagerdecomp.testing.KernelWitness`, a C++ key below
the mode's. ``make parity`` (no C++ library) runs the tests that assert the Python path.
"""

import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.utils._mode_utils import no_dispatch

import eagerdecomp as ed
from eagerdecomp.runtime import keymode
from eagerdecomp.testing import KernelWitness, RecordingMode, witness_available

aten = torch.ops.aten
CXX = "C++ key"

needs_key = pytest.mark.skipif(keymode.key() is None, reason="the C++ key path needs the C++ library")


def tls_state():
    return (
        str(torch._C._dispatch_tls_local_include_set()),
        str(torch._C._dispatch_tls_local_exclude_set()),
        torch.is_grad_enabled(),
    )


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    return model, torch.randn(5, 8)


def grads(model, x):
    model.zero_grad()
    loss = F.silu(model(x)).logsumexp(-1).sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_python_path_reasons_are_reported():
    mode = ed.EagerDecompMode("core_aten")
    with RecordingMode(), mode:  # a Python mode outside: the Python path, which it sees below
        F.silu(torch.randn(3))
    assert mode.path.startswith("Python")
    assert mode.report().paths[mode.path] == 1
    with ed.EagerDecompMode("core_aten", compile=lambda gm, inputs: gm) as compiled:
        F.silu(torch.randn(3))
    assert compiled.path.startswith("Python")


@needs_key
@pytest.mark.usefixtures("trace_first")  # counts the C++ hit of a traced kernel
def test_the_mode_takes_its_key_and_no_python_mode():
    x = torch.randn(4)
    with ed.EagerDecompMode("core_aten") as mode:
        assert torch._C._len_torch_dispatch_stack() == 0  # no Python mode was pushed
        assert keymode.key() in str(torch._C._dispatch_tls_local_include_set())
        y = F.silu(x)
        F.silu(x)
    assert keymode.key() not in str(torch._C._dispatch_tls_local_include_set())
    assert mode.path == CXX and mode.report().paths == {CXX: 1}
    torch.testing.assert_close(y, F.silu(x))
    row = mode.report().row(aten.silu.default)
    assert row.route == "decomposed" and row.cpp_hits == 1  # the second call: served in C++
    assert ed.cache_info().cxx_mode >= 1


@needs_key
@pytest.mark.usefixtures("trace_first")  # counts C++ hits of traced kernels
def test_results_and_gradients_equal_native_and_autograd_records_the_users_ops():
    model, x = model_and_data()
    ref_loss, ref_grads = grads(model, x)
    with KernelWitness() as seen, ed.EagerDecompMode("core_aten") as mode:
        out = F.gelu(model[0](x))
        assert type(out.grad_fn).__name__ == "GeluBackward0"  # autograd recorded above the key
        for _ in range(2):  # the second step: every decomposed call a C++ hit
            loss, got = grads(model, x)
    assert mode.path == CXX
    torch.testing.assert_close(loss, ref_loss)
    for g, r in zip(got, ref_grads):
        torch.testing.assert_close(g, r)
    seen.assert_only("core_aten")
    report = mode.report()
    assert report.row(aten.gelu_backward.default).cpp_hits >= 1
    assert report.row(aten.addmm.default).route == "passthrough"


@needs_key
def test_another_thread_is_unaffected():
    x = torch.randn(6)
    seen = {}

    def other():
        seen["included"] = keymode.key() in str(torch._C._dispatch_tls_local_include_set())
        seen["y"] = F.hardswish(x)

    with ed.EagerDecompMode("core_aten") as mode:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen["included"] is False
    torch.testing.assert_close(seen["y"], F.hardswish(x))
    assert mode.report().row(aten.hardswish.default) is None  # the other thread's call never reached it


@needs_key
def test_the_mode_reaches_threads_autograd_runs_for_it():
    # NOTE: edref is strict (core ATen only) and autograd runs a device's backward on its own
    # worker thread: the backward ops decompose there only if the key and the mode's state
    # travelled in at::ThreadLocalState (a C++ thread_local would not)
    from torch._decomp import decomposition_table

    from eagerdecomp.testing import reference_device

    threads = []

    def gelu_backward(*args, **kwargs):  # (traced on the thread that met the op)
        threads.append(threading.get_ident())
        return decomposition_table[aten.gelu_backward.default](*args, **kwargs)

    dev = reference_device()
    x = torch.randn(4, 5).to(dev).requires_grad_()
    with ed.EagerDecompMode("core_aten", decompositions={aten.gelu_backward.default: gelu_backward}) as mode:
        F.gelu(x).sum().backward()
    assert mode.path == CXX
    assert threads and threads[0] != threading.get_ident()  # autograd's device thread
    torch.testing.assert_close(x.grad.cpu(), torch.func.grad(lambda t: F.gelu(t).sum())(x.detach().cpu()))
    assert mode.report().row(aten.gelu_backward.default).calls == 1


@needs_key
def test_a_python_mode_inside_sees_the_users_ops_and_the_key_decomposes_after_it():
    x = torch.randn(5)
    with ed.EagerDecompMode("core_aten") as mode:
        with RecordingMode() as inner:
            y = F.silu(x)
    assert mode.path == CXX
    assert aten.silu.default in inner.ops  # the Python key outranks ours: the user's op, as with two Python modes
    assert mode.report().row(aten.silu.default).route == "decomposed"
    torch.testing.assert_close(y, F.silu(x))


@needs_key
def test_a_python_mode_outside_keeps_the_python_path_and_sees_only_opset_ops():
    x = torch.randn(5)
    with RecordingMode() as outer, ed.EagerDecompMode("core_aten") as mode:
        F.silu(x)
    assert mode.path.startswith("Python")
    outer.assert_only("core_aten")


@needs_key
def test_no_grad_inference_mode_and_composite_implicit_ops():
    model, x = model_and_data()
    with torch.inference_mode():
        ref = model(x)
    with ed.EagerDecompMode("core_aten") as mode, KernelWitness() as seen:
        with torch.no_grad():
            a = model(x)
        with torch.inference_mode():
            b = model(x)  # below autograd: aten.linear itself reaches the key
    torch.testing.assert_close(a, ref)
    torch.testing.assert_close(b, ref)
    assert mode.report().row(aten.linear.default) is not None
    seen.assert_only("core_aten")


@needs_key
def test_torch_func_transforms():
    x = torch.randn(3, 4)
    f = lambda t: F.gelu(t).logsumexp(-1).sum()  # noqa: E731
    with ed.EagerDecompMode("core_aten") as mode:
        g = torch.func.grad(f)(x)
        v = torch.func.vmap(lambda t: F.silu(t).sum())(x)
    assert mode.path == CXX
    torch.testing.assert_close(g, torch.func.grad(f)(x))
    torch.testing.assert_close(v, torch.func.vmap(lambda t: F.silu(t).sum())(x))


@needs_key
def test_a_dispatch_subclass_and_fake_and_meta_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.logging_tensor import LoggingTensor

    x, m = torch.randn(4), torch.empty(4, device="meta")
    with ed.EagerDecompMode("core_aten") as mode, KernelWitness() as seen:
        sub = F.silu(LoggingTensor(x))  # its __torch_dispatch__ first, its plain ops then decomposed
        meta = F.silu(m)  # passes through: the meta kernel's answer
        with FakeTensorMode() as fake:
            f = F.silu(fake.from_tensor(x))
    assert mode.path == CXX
    torch.testing.assert_close(sub.elem, F.silu(x))
    assert meta.device.type == "meta" and meta.shape == (4,)
    assert f.shape == (4,)
    assert mode.report().row(aten.silu.default).calls == 1  # the subclass's inner call only
    seen.assert_only("core_aten")


@needs_key
def test_no_dispatch_is_respected():
    x = torch.randn(4)
    with ed.EagerDecompMode("core_aten") as mode, KernelWitness() as seen:
        with no_dispatch():
            F.silu(x)
    assert mode.report().row(aten.silu.default) is None
    assert aten.silu.default in seen.ops  # ran natively, as under a Python mode


@needs_key
def test_torch_compile_inside_the_mode():
    torch._dynamo.reset()
    x = torch.randn(8)
    f = torch.compile(lambda t: F.silu(t) * 2, backend="aot_eager")
    with ed.EagerDecompMode("core_aten") as mode, KernelWitness() as seen:
        y = f(x)
        y2 = f(x)
    assert mode.path == CXX
    torch.testing.assert_close(y, F.silu(x) * 2)
    torch.testing.assert_close(y2, y)
    seen.assert_only("core_aten")


@needs_key
def test_an_exception_leaves_the_key_set_exactly_as_before():
    before = tls_state()
    a, b = torch.randn(3), torch.randn(4)
    with pytest.raises(RuntimeError):
        with ed.EagerDecompMode("core_aten"):
            inside = tls_state()
            with pytest.raises(RuntimeError):
                torch.addcmul(a, a, b)  # decomposed; eager's shape error
            assert tls_state() == inside  # nothing leaked from the failed call
            raise RuntimeError("leaving the mode by an exception")
    assert tls_state() == before
    with pytest.raises(ed.UnsupportedOpError):
        with ed.EagerDecompMode(["aten::add.Tensor"]):
            F.silu(torch.randn(2))
    assert tls_state() == before


@needs_key
def test_nested_modes_compose_through_the_python_path():
    x = torch.randn(5)
    with ed.EagerDecompMode("core_aten") as outer, ed.EagerDecompMode("core_aten") as inner:
        y = F.silu(x)
    assert outer.path == CXX and inner.path.startswith("Python")
    torch.testing.assert_close(y, F.silu(x))


@needs_key
def test_record_function_passes_through_in_cxx(monkeypatch):
    # an optimizer step opens a record_function range: its enter and exit ops pass the key in C++
    entered = []
    real = keymode._op
    monkeypatch.setattr(keymode, "_op", lambda name, overload: entered.append(name) or real(name, overload))
    with ed.EagerDecompMode("core_aten") as mode:
        for _ in range(3):
            with torch.autograd.profiler.record_function("step"):
                pass
    assert mode.path == CXX
    assert not [n for n in entered if n.startswith("profiler::")]
    row = mode.report().row(torch.ops.profiler._record_function_enter_new.default)
    assert row.route == "passthrough" and row.calls == 3


@pytest.mark.skipif(not witness_available(), reason="the witness needs the C++ library")
def test_the_witness_sees_what_reaches_the_kernels():
    x = torch.randn(4)
    with KernelWitness() as native:
        F.silu(x)
    assert aten.silu.default in native.ops  # without a mode the op itself reaches the kernels
    with pytest.raises(AssertionError, match="silu"):
        native.assert_only("core_aten")
    with KernelWitness() as seen, ed.EagerDecompMode("core_aten", on_unsupported="fallthrough"):
        torch.ops.aten.hardswish.default(x)
    seen.assert_only("core_aten")


@needs_key
def test_a_taken_slot_warns_and_keeps_the_python_path():
    code = (
        "import torch\n"
        f"lib = torch.library.Library('_', 'IMPL')\n"
        f"lib.fallback(lambda *a: None, '{keymode.key()}')\n"
        "import warnings, eagerdecomp as ed\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    with ed.EagerDecompMode() as m:\n"
        "        y = torch.nn.functional.silu(torch.ones(2))\n"
        "print(m.path)\n"
        "print([str(x.message) for x in w if 'dispatch key is taken' in str(x.message)][:1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Python: its dispatch key is taken" in out.stdout
    assert "a fallback is registered" in out.stdout


class _Sub(torch.Tensor):
    pass


@needs_key
@pytest.mark.parametrize("opset", ["core_aten", "prims"])
def test_fresh_tensors_where_pytorch_stashes_the_python_modes(opset):
    # NOTE: nn.Parameter (Tensor._make_subclass: detach) and as_subclass (alias) call their op
    # where no Python mode sees it and the key does: each still gets a tensor with no Python
    # object, and only opset ops reach the kernels (under prims, neither detach nor alias is one)
    x = torch.randn(3)
    for _ in range(2):  # a miss (answered in Python), then a C++ hit
        with KernelWitness() as seen, ed.EagerDecompMode(opset) as mode:
            p = torch.nn.Parameter(x)
            s = x.as_subclass(_Sub)
            d = x.detach()
        assert mode.path == CXX
        assert type(p) is torch.nn.Parameter and type(s) is _Sub and p.requires_grad
        for t in (p, s, d):  # views of x, as eager's: same storage and layout
            assert t.data_ptr() == x.data_ptr() and (t.shape, t.stride()) == (x.shape, x.stride())
        assert d._version == x._version and not d.requires_grad
        d.add_(0)  # shares x's version counter, as eager's detach
        assert x._version == d._version
        seen.assert_only(opset)
    assert mode.report().row(aten.detach.default).cpp_hits >= 1


@needs_key
def test_meta_mixed_with_a_device_is_refused_before_any_kernel_runs():
    a, m, two = torch.randn(3), torch.randn(3, device="meta"), torch.tensor(2.0)
    with KernelWitness() as seen, ed.EagerDecompMode("core_aten") as mode:
        with pytest.raises(ed.DeviceMismatchError, match=r"aten.addcmul.default: .*cpu.*meta"):
            torch.addcmul(a, m, a)
    assert mode.path == CXX
    assert not seen.ops  # the refused call reached no kernel
    with ed.EagerDecompMode("core_aten") as mode:
        y = torch.addcmul(m, m, m, value=0.5) + two  # meta alone, and a 0-dim CPU tensor mixes as in eager
    assert mode.path == CXX
    assert y.device.type == "meta" and y.shape == (3,)
