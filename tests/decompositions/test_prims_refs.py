"""A prims opset's factories and in-place rules against eager (prims_refs.py, table.py).

Found by the OpInfo conformance run under ``prims_fusion``: torch._refs refuse what eager
accepts (``layout=None``, ``memory_format=None``, a fill value of a wider Python type), and
torch._decomp's generic in-place rules write a result of a dtype eager refuses to cast.
Every call is compared with native eager (values, dtype, shape, strides, inputs afterwards),
the witness checking that only the preset's ops reached the kernels.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.compare import assert_raises_like_eager, check_against_eager

aten = torch.ops.aten
PRESETS = ("prims", "prims_fusion")

FACTORIES = {
    "empty-then-fill": lambda: torch.empty(3, 4).fill_(1.5),
    "empty-channels-last": lambda: torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).zero_(),
    "empty_strided": lambda: torch.empty_strided((2, 3), (1, 2)).fill_(2.0),
    "full": lambda: torch.full((2, 3), 1.5),
    "full-int-from-float": lambda: torch.full((2,), 2.7, dtype=torch.int64),
    "full-int-from-negative-float": lambda: torch.full((3,), -2.7, dtype=torch.int8),
    "full-bool-from-float": lambda: torch.full((2,), 0.5, dtype=torch.bool),
    "full_like-int": lambda: torch.full_like(torch.zeros(2, 3, dtype=torch.int32).t(), -3.9),
    "arange-start-step": lambda: torch.arange(1, 7, 2),
    "arange-float": lambda: torch.arange(0.0, 1.0, 0.25),
    "scalar_tensor-int": lambda: torch.scalar_tensor(3),
    "scalar_tensor-bool-dtype": lambda: torch.scalar_tensor(2.5, dtype=torch.bool),
    "zeros-out-bool": lambda: torch.zeros(2, 3, out=torch.empty(0, dtype=torch.bool)),
    "ones-out-bool": lambda: torch.ones(2, 3, out=torch.empty(0, dtype=torch.bool)),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_factories_like_eager(name, preset):
    check_against_eager(FACTORIES[name], opset=preset)


# out= overloads of prims_fusion's library ops: no ref covers them; the variant rule (the
# functional op, then eager's resize and copy_) reaches the preset through the library op
LIBRARY_OUTS = {
    "mm-out": lambda a, b: torch.mm(a, b, out=torch.empty(0)),
    "bmm-out": lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0), out=torch.empty(5)),
    "argmax-out": lambda a, b: torch.argmax(a, 1, out=torch.empty(0, dtype=torch.int64)),
    "sort-values-out": lambda a, b: torch.sort(a, 1, out=(torch.empty(0), torch.empty(0, dtype=torch.int64))),
}


@pytest.mark.parametrize("name", list(LIBRARY_OUTS))
def test_library_op_outs_like_eager(name):
    check_against_eager(LIBRARY_OUTS[name], torch.randn(3, 4), torch.randn(4, 2), opset="prims_fusion")


# a float fill value into an integer tensor: eager truncates toward zero (F.pad's default value
# is 0.0, whatever the input's dtype)
FILLS = {
    "fill_-int": lambda x: x.fill_(3.9),
    "fill_-negative": lambda x: x.fill_(-3.9),
    "pad-constant": lambda x: F.pad(x, (1, 2)),
    "pad-value": lambda x: F.pad(x, (1, 1, 0, 1), value=-1.5),
    "max_pool2d": lambda x: F.max_pool2d(x.view(1, 1, 4, 6), 2, padding=1),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(FILLS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int16])
def test_float_fill_values_into_integers_like_eager(name, dtype, preset):
    if name == "max_pool2d" and preset == "prims":
        pytest.skip("max_pool2d reaches prims_fusion's library ops, not plain prims")
    check_against_eager(FILLS[name], torch.arange(-12, 12, dtype=dtype).view(4, 6), opset=preset)


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.full((2,), -2.7, dtype=torch.uint8),
        lambda: torch.full((2,), 300, dtype=torch.uint8),
        lambda: torch.zeros(3, dtype=torch.int64).fill_(float("nan")),
        lambda: torch.zeros(3, dtype=torch.int32).fill_(float("inf")),
    ],
    ids=["negative-into-uint8", "past-uint8", "nan-into-int64", "inf-into-int32"],
)
def test_fill_values_eager_refuses_raise_eagers_error(fn):
    assert_raises_like_eager(fn, opset="prims_fusion", message=True)


# NOTE: torch._decomp's register_inplace rules (36 ops) copied the float result of logit_ /
# ldexp_ into an integer or bool self, where eager refuses the cast.
INPLACE = {
    "logit_-int64": lambda: torch.arange(3).logit_(),
    "ldexp_-bool": lambda: torch.ones(3, dtype=torch.bool).ldexp_(torch.ones(3, dtype=torch.bool)),
    "ldexp_-int64": lambda: torch.arange(3).ldexp_(torch.arange(3)),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_refuses_the_cast_eager_refuses(name, preset):
    assert_raises_like_eager(INPLACE[name], opset=preset, message="can't be cast to the desired output type")


# NOTE: torch._refs' in-place forms (113 ops: the out= form with self as out) resized a self
# smaller than the broadcast shape, where eager refuses it
BROADCAST_SELF = {
    "lt_": lambda: torch.zeros(5, 1).lt_(torch.zeros(5)),
    "clamp_max_": lambda: torch.zeros(5, 1, dtype=torch.int64).clamp_max_(torch.ones(5, dtype=torch.int64)),
    "xlogy_": lambda: torch.ones(5, 1).xlogy_(torch.ones(5)),
    "add_": lambda: torch.ones(1, 3).add_(torch.ones(2, 3)),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", list(BROADCAST_SELF))
def test_inplace_refuses_to_grow_self_like_eager(name, preset):
    assert_raises_like_eager(BROADCAST_SELF[name], opset=preset, message="doesn't match the broadcast shape")


@pytest.mark.parametrize("preset", PRESETS)
def test_inplace_rules_still_write_what_eager_writes(preset):
    check_against_eager(lambda x: x.logit_(eps=1e-3), torch.rand(3, 4).t(), opset=preset, exact=False)
    check_against_eager(lambda x: x.ldexp_(torch.tensor([1.0, 2.0, 3.0])), torch.randn(2, 3), opset=preset)
    check_against_eager(lambda x: x.lt_(torch.zeros(3)), torch.randn(4, 3).t().t(), opset=preset)
    check_against_eager(lambda x: x.clamp_max_(0.5).add_(torch.ones(3), alpha=2), torch.randn(2, 3), opset=preset)


def _seeded(fn):
    def call(*args):
        torch.manual_seed(0)
        return fn(*args)

    return call


# NOTE: a ref's in-place form calls its functional ref directly, past our decomposition of the
# functional op: geometric_ of an int64 tensor drew rand_like(int64) and raised; in-place forms
# of ops with our own decomposition now take it (eager's very numbers here; plain prims has no
# random op drawing eager's stream)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_inplace_forms_take_our_functional_decomposition(dtype):
    check_against_eager(_seeded(lambda x: x.geometric_(0.2)), torch.zeros(4, 5, dtype=dtype), opset="prims_fusion")
    check_against_eager(_seeded(lambda x: x.exponential_(1.5)), torch.zeros(4, 5), opset="prims_fusion")


# NOTE: prims.as_strided's meta fails on a 0-d size (reduce() with no start value): as_strided's
# gradient at a one-element input asks for one
@pytest.mark.parametrize("preset", PRESETS)
def test_zero_dim_as_strided_like_eager(preset):
    check_against_eager(lambda x: torch.as_strided(x, (), (), 2), torch.arange(4.0), opset=preset)
    if preset == "prims_fusion":  # (a scatter: index_put, one of its library ops)
        check_against_eager(
            lambda x: torch.as_strided_scatter(x, torch.tensor(7.0), (), (), 1), torch.arange(4.0), opset=preset
        )

    def grad(x):
        x = x.clone().requires_grad_()
        return torch.autograd.grad(torch.as_strided(x, (1,), (1,), 0), x, torch.ones(1, dtype=x.dtype))

    check_against_eager(grad, torch.randn(1, dtype=torch.float64), opset=preset)


# NOTE: found by test_layouts.py under prims_fusion: on the bypass path (polygamma decomposes
# eagerly: its n is data), the runtime moves a resized out= to eager's strides with aten.clone
# (exact.relayout, called by runtime/core.py without the lowerer), which prims_fusion lacks: a
# leak (polygamma(2, x, out=) of a column-major x). relayout's and unalias' ops now go through
# the call's Lowerer (as direct._RealFixups does on the direct tier).
def test_bypass_path_fixups_stay_in_the_preset():
    out = lambda x, o: torch.polygamma(2, x, out=o)  # noqa: E731
    check_against_eager(out, torch.rand(5, 5).t() + 0.5, torch.empty(0), opset="prims_fusion", exact=False)


# NOTE: eager's native_group_norm refuses an input not contiguous in its memory format; the ref
# computed any layout (test_layouts.py under prims_fusion: strided, column-major)
@pytest.mark.parametrize("preset", PRESETS)
def test_native_group_norm_layouts_like_eager(preset):
    def group_norm(x):
        return aten.native_group_norm(x, None, None, 2, 4, 9, 2, 1e-5)

    assert_raises_like_eager(group_norm, torch.randn(2, 4, 3, 3).transpose(2, 3), opset=preset, message=True)
    cl = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)
    check_against_eager(group_norm, cl, opset=preset, exact=False)
    check_against_eager(group_norm, torch.randn(2, 4, 3, 3), opset=preset, exact=False)


# -- views by shape (prims_refs.view_strides: ATen's rule, where the refs' helper passed a size-1 dim) --


def _layouts(seed, n=300):
    """Random (shape, strides, offset) over a 64-element buffer, sizes 0-3 and 1s in between;
    strides permuted, gapped, 0 (expanded) and overlapping."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        nd = int(torch.randint(0, 5, (1,), generator=g))
        shape = [int(s) for s in torch.randint(0, 4, (nd,), generator=g)]
        stride = [int(s) for s in torch.randint(0, 13, (nd,), generator=g)]
        yield shape, stride


def _factorings(numel):
    yield [numel]
    yield [-1, 1]
    for a in (2, 3, 4, 6):
        if numel % a == 0:
            yield [a, numel // a]
            yield [1, a, 1, numel // a]


def test_view_strides_is_eagers_rule():
    from eagerdecomp.decompositions.prims_refs import view_strides

    buf = torch.arange(256.0)
    checked = 0
    for shape, stride in _layouts(0):
        if shape and max((s - 1) * t for s, t in zip(shape, stride)) >= 200:
            continue
        x = buf.as_strided(shape, stride)
        for new in _factorings(x.numel()):
            new = list(torch.empty(0).new_empty(x.numel()).view(new).shape)
            try:
                want = x.view(new).stride()
            except RuntimeError:
                want = None
            got = view_strides(x.shape, x.stride(), new)
            assert (None if got is None else tuple(got)) == want, (shape, stride, new)
            checked += 1
    assert checked > 500


_G = torch.Generator().manual_seed(11)
T25, T2345, T2344, T31 = (torch.randn(*s, generator=_G) for s in ((2, 5), (2, 3, 4, 5), (2, 3, 4, 4), (3, 1)))
RESHAPES = {
    # a size-1 dim between two dims whose strides do not chain: no view exists, eager copies
    "size-1-between": lambda: T25[:, :3].unsqueeze(1).reshape(6),
    "repeat-transposed": lambda: T2345.transpose(1, 2).repeat(1, 2, 1, 1),
    "view-channels-last": lambda: T2344.to(memory_format=torch.channels_last).view(2, 3, 16),
    "view-expanded": lambda: T31.expand(3, 4).view(3, 2, 2),
    "reshape-expanded": lambda: T31.expand(3, 4).reshape(12),
    "view-empty": lambda: torch.zeros(0, 3).view(3, 0),
    "view-0d": lambda: T31[:1][0].view([]),
    "reshape-0d": lambda: T31[0].reshape([]),
    # (a 0-d view: prims.as_strided's meta refused an empty size; the MarginLoss device test)
    "multilabel-margin-backward-empty": lambda: aten.multilabel_margin_loss_backward.default(
        torch.tensor(1.0),
        T31[:0].expand(0, 4),
        torch.ones(0, 4, dtype=torch.long),
        1,
        torch.ones(0, 4, dtype=torch.bool),
    ),
}


@pytest.mark.parametrize("tier", ["direct", "traced"])
@pytest.mark.parametrize("name", list(RESHAPES))
def test_views_and_reshapes_like_eager(name, tier, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2" if tier == "direct" else "0")
    check_against_eager(RESHAPES[name], opset="prims_fusion")


def test_view_eager_refuses_raises_eagers_error():
    x = T25[:, :3].unsqueeze(1)
    assert_raises_like_eager(lambda: x.view(6), opset="prims_fusion", message=True)


def test_repeat_at_lengths_that_change_like_eager(monkeypatch):
    # a shape-generic kernel (lengths that change every call, as generate()'s): the rule on
    # symbolic sizes, with its guards (JetMoe's key/value heads crashed on replay)
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "0")

    def heads():
        return [T2345[:1, :2, : n % 5 + 1].transpose(1, 2).transpose(1, 2).repeat(1, 3, 1, 1) for n in range(3, 12)]

    check_against_eager(heads, opset="prims_fusion")


COPIES = {
    "fill-tensor": lambda: T2345[0, 0].clone().t().fill_(torch.tensor(2.5)),
    "fill-tensor-int-from-float": lambda: torch.zeros(3, dtype=torch.int32).fill_(torch.tensor(-2.7)),
    "copy-broadcast-cast": lambda: aten.copy.default(
        T2344[0, 0, :, :3].clone().t(), torch.arange(4.0).view(1, 4).double()
    ),
    "copy-expanded-self": lambda: aten.copy.default(T31.expand(3, 4), T2345[0, 0, 0, :4]),
    "copy-gapped": lambda: aten.copy.default(T2345[0, :, :, :4].clone()[:, :, ::2], T31.view(3)[:2]),
}


@pytest.mark.parametrize("name", list(COPIES))
def test_functional_copy_like_eager(name):
    check_against_eager(COPIES[name], opset="prims_fusion")


def test_functional_copy_into_an_overlapping_self_is_declined():
    import eagerdecomp as ed

    overlapping = T2345.flatten()[:6].as_strided((3, 3), (1, 1))  # no 0 stride: eager's result depends on order
    with pytest.raises(ed.UnsupportedOpError, match="aten.copy.default"), ed.EagerDecompMode("prims_fusion"):
        aten.copy.default(overlapping, T2345[0, 0, 0, :3])


_INTS = (torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(2)) * 100).to(torch.int32)
NARROW_REDUCTIONS = {
    # prims.sum/prod's ATen form promotes to int64 where their meta keeps the dtype: a traced
    # prod(dtype=torch.bool) returned int64 (the uncapped OpInfo run, prod at bool)
    "prod-bool": lambda: torch.prod(_INTS > 0, 1, dtype=torch.bool),
    "prod-bool-keepdim": lambda: torch.prod(_INTS > 0, 1, keepdim=True, dtype=torch.bool),
    "sum-bool": lambda: torch.sum(_INTS > 90, 2, dtype=torch.bool),
    "sum-all-int8-wraps": lambda: torch.sum(_INTS, dtype=torch.int8),
    "sum-int16": lambda: torch.sum(_INTS, 0, dtype=torch.int16),
    "prod-int32-wraps": lambda: torch.prod(_INTS, 2, dtype=torch.int32),
    "prod-all-uint8": lambda: torch.prod(_INTS, dtype=torch.uint8),
    "sum-float-to-bool": lambda: torch.sum(torch.tensor([[0.0, 0.5], [0.0, 0.0]]), 1, dtype=torch.bool),
    "nansum-int16": lambda: torch.nansum(_INTS, 1, dtype=torch.int16),
    "sum-int32-default": lambda: torch.sum(_INTS, 1),
}


@pytest.mark.parametrize("tier", ["direct", "traced"])
@pytest.mark.parametrize("name", list(NARROW_REDUCTIONS))
def test_narrow_integer_and_bool_reductions_like_eager(name, tier, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2" if tier == "direct" else "0")
    check_against_eager(NARROW_REDUCTIONS[name], opset="prims_fusion")
