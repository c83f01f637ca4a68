"""scatter_reduce, its callers and masked_scatter under prims_fusion against eager (prims_scatter.py).

Core ATen keeps scatter_reduce and masked_scatter; prims_fusion lowers them through its library
ops (scatter_add, scatter, gather, sort). Every call is compared with native CPU eager (values,
dtype, shape, strides, inputs afterwards), the witness checking that only the preset's ops
reached the kernels: random inputs with duplicate indices, integer and float dtypes, NaN,
non-contiguous inputs, empty indices; eager's errors where eager raises.
"""

import subprocess
import sys

import pytest
import torch

import eagerdecomp as ed
from eagerdecomp.decompositions import prims_scatter
from eagerdecomp.testing import KernelWitness, witness_available
from tests.compare import assert_raises_like_eager, check_against_eager

PRESET = "prims_fusion"
REDUCES = ("sum", "prod", "mean", "amax", "amin")
DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bfloat16)


def _values(shape, dtype, gen, nan=False):
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if nan and x.numel() > 3:
            x.view(-1)[torch.randperm(x.numel(), generator=gen)[:2]] = float("nan")
        return x.to(dtype)
    low, high = (0, 6) if dtype == torch.uint8 else (-5, 6)
    return torch.randint(low, high, shape, generator=gen, dtype=dtype)


def _exact(reduce, dtype, index, dim):
    # eager folds a float product in index order; past _IN_ORDER_MAX entries the scan groups it
    # otherwise (the dtype's tolerance); half types: the CPU kernel may accumulate in float
    if dtype in (torch.bfloat16, torch.float16) and reduce in ("sum", "mean", "prod"):
        return False
    return not (reduce == "prod" and dtype.is_floating_point and index.shape[dim] > prims_scatter._IN_ORDER_MAX)


# (self shape, dim, index shape, src shape, rows the index draws from)
SHAPES = {
    "2d-dim0": ((5, 4), 0, (7, 4), (7, 4)),
    "2d-dim1": ((4, 6), 1, (4, 9), (4, 9)),
    "index-smaller-than-src": ((5, 4), 0, (3, 2), (6, 5)),
    "3d-dim-1": ((2, 3, 4), -1, (2, 3, 8), (2, 3, 8)),
    "mid-groups": ((4, 3), 0, (30, 3), (30, 3)),  # past _IN_ORDER_FEW: the scan, but a float product
    "long-groups": ((3, 2), 0, (80, 2), (80, 2)),  # past _IN_ORDER_MAX: the scan alone
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_like_eager(shape, dtype, reduce, include_self):
    self_shape, dim, index_shape, src_shape = SHAPES[shape]
    gen = torch.Generator().manual_seed(hash((shape, str(dtype), reduce, include_self)) % 2**31)
    x = _values(self_shape, dtype, gen, nan=True)
    src = _values(src_shape, dtype, gen, nan=True)
    index = torch.randint(0, self_shape[dim], index_shape, generator=gen)
    check_against_eager(
        lambda x, i, s: x.scatter_reduce(dim, i, s, reduce, include_self=include_self),
        x,
        index,
        src,
        opset=PRESET,
        exact=_exact(reduce, dtype, index, dim),
    )


@pytest.mark.parametrize("reduce", REDUCES)
def test_scatter_reduce_inplace_noncontiguous_like_eager(reduce):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, generator=gen).t()  # (5, 6), column-major
    src = torch.randn(8, 7, generator=gen)[::2, ::2]  # (4, 4), strided
    index = torch.randint(0, 5, (4, 4), generator=gen)
    check_against_eager(lambda x, i, s: x.scatter_reduce_(0, i, s, reduce), x, index, src, opset=PRESET)


@pytest.mark.parametrize("reduce", ["prod", "amin", "mean"])
def test_scatter_reduce_out_like_eager(reduce):
    gen = torch.Generator().manual_seed(4)
    x, src = torch.randn(4, 3, generator=gen), torch.randn(6, 3, generator=gen)
    index = torch.randint(0, 4, (6, 3), generator=gen)
    check_against_eager(
        lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, out=torch.empty(0)), x, index, src, opset=PRESET
    )


def test_scatter_reduce_amax_signed_zero_and_nan_like_eager():
    # ties keep the earlier value (the sign of a zero shows it); a NaN wins and stays
    x = torch.tensor([0.0, -0.0, 1.0, float("nan")])
    src = torch.tensor([-0.0, 0.0, float("nan"), 2.0, 0.0, -0.0, 5.0, 1.0])
    index = torch.tensor([0, 1, 2, 2, 0, 1, 3, 3])
    for reduce in ("amax", "amin"):
        for include_self in (True, False):
            _, got = check_against_eager(
                lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self),
                x,
                index,
                src,
                opset=PRESET,
            )
            want = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
            assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_scatter_reduce_scalar_and_empty_like_eager():
    f = lambda x, i, s: x.scatter_reduce(0, i, s, "prod", include_self=False)  # noqa: E731
    check_against_eager(f, torch.tensor(3.0), torch.tensor(0), torch.tensor(2.0), opset=PRESET)
    check_against_eager(f, torch.randn(4, 3), torch.empty(0, 3, dtype=torch.int64), torch.randn(2, 3), opset=PRESET)


def test_scatter_reduce_int64_products_exact():
    # products past 2**53: no float detour could hold them
    x = torch.full((3,), 3**20, dtype=torch.int64)
    src = torch.tensor([3**15, 7, 3**19, 11, 13, 2**40], dtype=torch.int64)
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    for reduce in ("prod", "amax", "amin", "mean", "sum"):
        check_against_eager(lambda x, i, s: x.scatter_reduce(0, i, s, reduce), x, index, src, opset=PRESET)


@pytest.mark.parametrize(
    "case",
    [
        "out-of-bounds",
        "negative-index",
        "bad-reduce",
    ],
)
def test_scatter_reduce_errors_like_eager(case):
    x, src = torch.randn(4, 3), torch.randn(4, 3)
    index = {"out-of-bounds": torch.tensor([[0, 4, 1]]), "negative-index": torch.tensor([[0, -1, 1]])}.get(
        case, torch.zeros(1, 3, dtype=torch.int64)
    )
    reduce = "median" if case == "bad-reduce" else "amax"
    assert_raises_like_eager(lambda: x.scatter_reduce(0, index, src, reduce), opset=PRESET, message=None)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_legacy_scatter_reduce_like_eager(reduce):
    gen = torch.Generator().manual_seed(5)
    x, src = torch.randn(4, 5, generator=gen), torch.randn(6, 5, generator=gen)
    index = torch.randint(0, 4, (6, 5), generator=gen)
    check_against_eager(lambda x, i, s: x.scatter(0, i, s, reduce=reduce), x, index, src, opset=PRESET)
    check_against_eager(lambda x, i: x.scatter_(0, i, 1.5, reduce=reduce), x, index, opset=PRESET)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int16, torch.uint8], ids=str)
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_like_eager(reduce, dtype, include_self):
    gen = torch.Generator().manual_seed(7)
    x = _values((5, 3, 4), dtype, gen)
    src = _values((5, 6, 4), dtype, gen)
    for index_dtype in (torch.int32, torch.int64):
        index = torch.randint(0, 3, (6,), generator=gen, dtype=index_dtype)  # duplicates
        check_against_eager(
            lambda x, i, s: x.index_reduce(1, i, s, reduce, include_self=include_self), x, index, src, opset=PRESET
        )


MASKS = {
    "same-shape": ((3, 5), (3, 5)),
    "mask-broadcasts": ((4, 6), (6,)),
    "self-broadcasts": ((1, 6), (4, 6)),
    "3d": ((2, 3, 4), (2, 1, 4)),
}


@pytest.mark.parametrize("shapes", list(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16], ids=str)
def test_masked_scatter_like_eager(shapes, dtype):
    self_shape, mask_shape = MASKS[shapes]
    gen = torch.Generator().manual_seed(11)
    x = torch.randint(0, 2, self_shape, generator=gen).to(dtype)
    mask = torch.rand(mask_shape, generator=gen) > 0.5
    source = (torch.arange(40).view(5, 8) + 1).to(dtype)
    check_against_eager(lambda x, m, s: x.masked_scatter(m, s), x, mask, source, opset=PRESET)
    if torch.broadcast_shapes(self_shape, mask_shape) == torch.Size(self_shape):
        check_against_eager(lambda x, m, s: x.masked_scatter_(m, s), x, mask, source, opset=PRESET)


def test_masked_scatter_noncontiguous_and_empty_like_eager():
    x = torch.arange(12.0).view(3, 4).t()
    mask = torch.tensor([True, False, True])
    check_against_eager(lambda x, m, s: x.masked_scatter(m, s), x, mask, torch.randn(20)[::2], opset=PRESET)
    empty = torch.empty(5, 0, 5)
    check_against_eager(
        lambda x, m, s: x.masked_scatter_(m, s),
        empty,
        torch.ones(5, 1, 5, dtype=torch.bool),
        torch.empty(0),
        opset=PRESET,
    )
    check_against_eager(
        lambda x, m, s: x.masked_scatter(m, s),
        torch.randn(4),
        torch.zeros(4, dtype=torch.bool),
        torch.empty(0),
        opset=PRESET,
    )


@pytest.mark.parametrize("source", [torch.zeros(2), torch.empty(0)], ids=["short", "empty"])
def test_masked_scatter_short_source_raises_like_eager(source):
    x, mask = torch.arange(10.0), torch.arange(10) % 3 == 0
    assert_raises_like_eager(lambda: x.clone().masked_scatter_(mask, source), opset=PRESET, message=None)


def test_threshold_inplace_on_expanded_like_eager():
    # an in-place write into a tensor that overlaps itself is written through scatter_reduce
    x = torch.randn(1, 5).expand(6, 5)
    check_against_eager(lambda x: torch.nn.functional.threshold_(x, 0.0, -1.0), x, opset=PRESET)


@pytest.mark.skipif(not witness_available(), reason="needs eagerdecomp's C++ library")
def test_kernel_witness_sees_preset_ops_only():
    # the mode's C++ key path (RecordingMode, in check_against_eager, takes the Python path),
    # twice per call: the second a cached kernel's replay
    gen = torch.Generator().manual_seed(17)
    x, src = torch.randn(5, 4, generator=gen), torch.randn(40, 4, generator=gen)
    index = torch.randint(0, 5, (40, 4), generator=gen)
    ints = torch.randint(-3, 4, (40, 4), generator=gen)
    mask = torch.rand(5, 4, generator=gen) > 0.5
    calls = {
        "amax-scan": lambda: x.scatter_reduce(0, index, src, "amax", include_self=False),
        "int-prod-scan": lambda: ints[:5].scatter_reduce(0, index, ints, "prod"),
        "prod-in-order": lambda: x.scatter_reduce(0, index[:9], src, "prod"),
        "mean": lambda: ints[:5].scatter_reduce(0, index, ints, "mean", include_self=False),
        "index_reduce": lambda: x.index_reduce(0, index[:, 0], src, "amin"),
        "masked_scatter": lambda: x.masked_scatter(mask, src),
    }
    for name, f in calls.items():
        want = f()
        with KernelWitness() as seen, ed.EagerDecompMode(PRESET):
            got = [f(), f()]
        assert all(torch.equal(g, want) for g in got), name
        seen.assert_only(PRESET)


# NOTE: one reference device per process, and conftest registers edref in this one: the
# edprims check runs in a fresh interpreter. The device has kernels for the preset's ops alone
# (any other op raises there), and its own log names the kernels that ran.
_ON_EDPRIMS = """
import torch, eagerdecomp as ed
from eagerdecomp.device.refdev import PRIMS_DEVICE_NAME, device_ops, op_log
from eagerdecomp.testing import prims_reference_device

dev = prims_reference_device()
names = {op.name() for op in device_ops(PRIMS_DEVICE_NAME)}
ed.enable(dev)
gen = torch.Generator().manual_seed(13)
x, src = torch.randn(5, 4, generator=gen), torch.randn(9, 4, generator=gen)
index = torch.randint(0, 5, (9, 4), generator=gen)
mask = torch.rand(5, 4, generator=gen) > 0.5
ints = torch.randint(-4, 5, (5, 4), generator=gen)
calls = {
    "amax": lambda: x.scatter_reduce(0, index, src, "amax", include_self=False),
    "prod": lambda: x.scatter_reduce(0, index, src, "prod"),
    "int-prod": lambda: ints.scatter_reduce(0, index[:5], ints * 3, "prod", include_self=False),
    "mean": lambda: ints.scatter_reduce(0, index[:5], ints, "mean"),
    "index_reduce": lambda: x.index_reduce(0, index[:, 0], src, "amin"),
    "masked_scatter": lambda: x.masked_scatter(mask, src),
    "masked_select-out": lambda: torch.masked_select(x, mask, out=torch.empty(0, device=x.device)),
    "threshold_-expanded": lambda: torch.nn.functional.threshold_(src[:1].clone().expand(6, 4), 0.0, -1.0),
}
for name, f in calls.items():
    want = f()
    x, src, index, mask, ints = (t.to(dev) for t in (x, src, index, mask, ints))
    with op_log() as ran:
        got = f()
    x, src, index, mask, ints = (t.cpu() for t in (x, src, index, mask, ints))
    assert got.device == dev and torch.equal(got.cpu(), want), name
    # (the device's kernels: the preset's ops and what a device needs to exist, allocation)
    outside = sorted(op for op in ran if not op.startswith("prims::") and "aten::" + op not in names)
    assert ran and not outside, (name, outside)
print("ok", len(calls))
"""


@pytest.mark.skipif(not witness_available(), reason="needs eagerdecomp's C++ library")
def test_on_edprims_like_cpu():
    done = subprocess.run([sys.executable, "-c", _ON_EDPRIMS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ok 8" in done.stdout, done.stderr[-3000:]


SHAPE_ERRORS = {
    "index-wider-than-self": ((3, 2), (2, 3), (3, 3)),
    "index-longer-than-src": ((3, 2), (3, 2), (2, 2)),
    "index-fewer-dims": ((3, 2), (2,), (3, 3)),
    "src-fewer-dims": ((3, 2), (2, 2), (3,)),
}


@pytest.mark.parametrize("case", list(SHAPE_ERRORS))
def test_scatter_reduce_shape_errors_like_eager(case):
    self_shape, index_shape, src_shape = SHAPE_ERRORS[case]
    x, index, src = torch.zeros(self_shape), torch.zeros(index_shape, dtype=torch.int64), torch.ones(src_shape)
    assert_raises_like_eager(lambda: x.scatter_reduce(0, index, src, "amax"), opset=PRESET, message=True)


@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int64], ids=str)
def test_masked_scatter_dtype_errors_like_eager(mask_dtype):
    x = torch.zeros(4)
    assert_raises_like_eager(
        lambda: x.masked_scatter(torch.ones(4, dtype=mask_dtype), torch.ones(4)), opset=PRESET, message=True
    )
    assert_raises_like_eager(
        lambda: x.masked_scatter(torch.ones(4, dtype=torch.bool), torch.ones(4, dtype=torch.float64)),
        opset=PRESET,
        message=True,
    )
