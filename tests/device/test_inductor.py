"""torch.compile's default backend (Inductor) on the reference device edref.

edref's memory is host memory, so Inductor writes CPU's C++ kernels for it
(eagerdecomp.device.refdev) and must take CPU's paths everywhere it tests for a CPU
(eagerdecomp.device.inductor). Each test compiles the same code on CPU and on edref and
compares: values, dtypes, shapes, strides, and where both take the same attention
algorithm, the kernels Inductor wrote (the same C++, the device's name aside).

NOTE: on edref, scaled_dot_product_attention takes the math algorithm (edref's dispatch has no
fused choice; CPU's own flash kernel is not an edref op), so the CPU runs that compare against
models with attention take it too (sdpa_kernel(MATH)).
"""

import contextlib
import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eagerdecomp import device as device_switch
from eagerdecomp.demo import SmallCNN, TransformerBlock
from eagerdecomp.errors import BackendError

refdev = pytest.importorskip("eagerdecomp.device.refdev")

try:
    DEV = refdev.reference_device()
except BackendError as e:
    pytest.skip(f"reference device unavailable: {e}", allow_module_level=True)

if refdev.loaded_name() != "edref":  # (a process registers one reference device)
    pytest.skip("edref is not this process's reference device", allow_module_level=True)


@pytest.fixture(autouse=True)
def switched():
    # what Inductor leaves to kernels (mm.out, the optimizer's eager step) runs through the switch
    device_switch.enable(DEV)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    device_switch.disable(DEV)


def _kernels(codes) -> list[str]:
    # Inductor's output code, less what names the device (the wrapper allocates on edref with
    # empty_strided(..., device=), on CPU with its shorthand), a file or the compile's id
    out = []
    for code in codes:
        code = re.sub(r"AOT ID: .*|# kernel path: .*|/tmp/\S+", "", code).replace(f"'{DEV}'", "'cpu'")
        code = re.sub(r"empty_strided\((.*), device='edref', dtype=(.*)\)", r"empty_strided_cpu(\1, \2)", code)
        out.append(code.replace(DEV.type, "cpu"))
    return out


def _assert_same_kernels(dev_code, cpu_code):
    import difflib

    for got, want in zip(_kernels(dev_code), _kernels(cpu_code), strict=True):
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "cpu", "edref", n=1))
        assert not diff, diff[:3000]


def _compiled(fn, *args):
    """fn compiled afresh on ``device`` (no Inductor cache: the code is written for this run);
    returns (result, the output code)."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    torch._dynamo.reset()
    with fresh_cache():
        return run_and_get_code(torch.compile(fn), *args)


def _check_same(got, want):
    assert got.device == DEV and (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got.cpu(), want)


def test_reduction_after_a_linear_compiles_to_cpus_kernels():
    # Linear + GELU + softmax: a reduction fused after pointwise code (the scheduler's
    # reindexing for Triton took edref's node groups, and failed)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    x = torch.randn(4, 8)

    def f(m, t):
        y = torch.softmax(m(t), dim=-1)
        return y, y.var(dim=0) / 3  # (variance and a division by a constant: CPU's algorithms)

    with torch.no_grad():  # (one graph per device: the training tests below are heavy)
        want, cpu_code = _compiled(f, model, x)
        got, dev_code = _compiled(f, copy.deepcopy(model).to(DEV), x.to(DEV))
    for g, w in zip(got, want):
        _check_same(g, w)
    _assert_same_kernels(dev_code, cpu_code)


def test_index_copy_into_a_buffer_compiles_and_matches():
    # a static KV cache's update: indirect indices in C++ (their dtype comes from the cpp backend)
    def f(cache, pos, new):
        cache.index_copy_(1, pos, new)
        return cache.sum(dim=-1)

    cache, pos, new = torch.zeros(2, 6, 4), torch.tensor([2, 3]), torch.randn(2, 2, 4)
    want_cache = cache.clone()
    want, cpu_code = _compiled(f, want_cache, pos, new)
    dev_cache = cache.to(DEV)
    got, dev_code = _compiled(f, dev_cache, pos.to(DEV), new.to(DEV))
    _check_same(got, want)
    _check_same(dev_cache, want_cache)  # written in place, as on CPU
    _assert_same_kernels(dev_code, cpu_code)


def test_inductors_cpu_checks_answer_for_edref_only():
    from torch._inductor import ir, utils

    from eagerdecomp.device import inductor

    torch.compile(lambda t: t + 1)(torch.ones(2, device=DEV))  # Inductor's backends registered
    assert inductor.installed() == DEV.type
    get_current_backend = utils.get_current_backend  # (patched: looked up after)
    assert get_current_backend(DEV.type) == get_current_backend("cpu") == "cpp"
    assert ir.is_cpu(DEV) and ir.is_cpu(torch.device("cpu")) and not ir.is_cpu(torch.device("meta"))
    assert get_current_backend("cuda") != "cpp"  # other devices keep Inductor's answers
    with pytest.raises(BackendError, match="patched for 'edref' already"):
        inductor.install("edprims")


def test_a_check_that_moved_in_inductor_is_named_before_anything_changes(monkeypatch):
    from eagerdecomp.device import inductor

    moved = ("lowering", "div_prim", 'a.get_device().type == "xpu"', "(a test torch no longer has)")
    monkeypatch.setattr(inductor, "INLINE", [*inductor.INLINE, moved])
    with pytest.raises(BackendError, match=r"lowering\.div_prim no longer tests"):
        inductor._inline_rewrites("edref")


def _train(make, batch, device, steps, fresh=False, step_fn=None):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    x, y = (t.to(device) for t in batch)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(compiled(x), y) if step_fn is None else step_fn(compiled, x, y)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        return loss.detach(), grads

    from torch._inductor.utils import fresh_cache, run_and_get_code

    with fresh_cache() if fresh else contextlib.nullcontext():
        (loss, grads), codes = run_and_get_code(step)
        out = [(loss, grads)] + [step() for _ in range(steps - 1)]
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}, codes


def _check_training(make, batch, steps=2, same_kernels=True, step_fn=None):
    with sdpa_kernel(SDPBackend.MATH):
        want, want_state, cpu_code = _train(make, batch, "cpu", steps, fresh=same_kernels, step_fn=step_fn)
    got, got_state, dev_code = _train(make, batch, DEV, steps, fresh=same_kernels, step_fn=step_fn)
    if same_kernels:
        _assert_same_kernels(dev_code, cpu_code)
    for (gl, gg), (wl, wg) in zip(got, want):
        _check_same(gl, wl)
        for a, b in zip(gg, wg):
            _check_same(a, b)
    # NOTE: a gradient that is zero in exact arithmetic (the attention's key bias: softmax does
    # not see a shift) is rounding noise, which AdamW divides by its own RMS into steps of size lr:
    # such elements are compared by their gradients above, not by the parameters they move
    names = [n for n, _ in make().named_parameters()]
    noise = {n: torch.stack([g[i] for _, g in want]).abs().amax(0).cpu() < 1e-6 for i, n in enumerate(names)}
    for name, w in want_state.items():
        g = got_state[name]
        assert g.device == DEV and (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        keep = ~noise[name] if name in noise else torch.ones_like(w, dtype=torch.bool)
        torch.testing.assert_close(g.cpu()[keep], w[keep], msg=lambda m: f"{name}: {m}")


@pytest.mark.heavy
def test_compiled_demo_block_trains_with_adamw_as_on_cpu():
    _check_training(lambda: TransformerBlock(dropout=0.0), TransformerBlock.batch(), steps=3)


@pytest.mark.heavy
def test_compiled_demo_block_with_dropout_draws_as_on_cpu():
    # Inductor's own random numbers, seeded from the CPU generator edref draws from
    _check_training(lambda: TransformerBlock(dropout=0.1), TransformerBlock.batch(), steps=2, same_kernels=False)


@pytest.mark.heavy
def test_compiled_cnn_trains_as_on_cpu():
    # NOTE: kernels compared without Inductor's layout optimization: CPU's convolutions go
    # channels-last because oneDNN is there (graph.py decide_layout_opt); edref does not claim
    # oneDNN (its fake convolution would disagree with the channels-last strides)
    with torch._inductor.config.patch(layout_optimization=False):
        _check_training(SmallCNN, SmallCNN.batch(), steps=2)
    _check_training(SmallCNN, SmallCNN.batch(), steps=2, same_kernels=False)


def _llama():
    from eagerdecomp.workloads import llama

    return llama().train()


@pytest.mark.heavy
def test_compiled_llama_trains_as_on_cpu():
    pytest.importorskip("transformers")
    from eagerdecomp.workloads import VOCAB

    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    _check_training(_llama, (ids, ids.clone()), steps=2, step_fn=lambda m, x, y: m(input_ids=x, labels=y).loss)


@pytest.mark.heavy
def test_compiled_llama_generates_with_a_static_cache_as_on_cpu():
    pytest.importorskip("transformers")
    from eagerdecomp.workloads import VOCAB, llama

    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))

    def generate(device):
        torch._dynamo.reset()
        model = llama().to(device)
        model.forward = torch.compile(model.forward, fullgraph=True)
        return model.generate(
            ids.to(device), max_new_tokens=5, min_new_tokens=5, do_sample=False, cache_implementation="static"
        )

    with sdpa_kernel(SDPBackend.MATH):
        want = generate("cpu")
    got = generate(DEV)
    assert got.device == DEV and torch.equal(got.cpu(), want)
