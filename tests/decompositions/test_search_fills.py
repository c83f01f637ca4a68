"""searchsorted, bincount, repeat_interleave, index_reduce, scatter(value, reduce=) and
_trilinear (F.bilinear) fills against native eager: values, dtypes, shapes, strides; only
core ops below. bfloat16 reductions are held to the accuracy rule."""

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from tests.compare import check_against_eager


def _check(fn, *args):
    # reductions may round differently from the kernels: the dtype's tolerance, then the accuracy rule
    check_against_eager(fn, *args, exact=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(dtype, right):
    g = torch.Generator().manual_seed(0)
    seq = torch.sort(torch.randint(0, 10, (3, 4, 9), generator=g).to(dtype), -1).values
    v = torch.randint(-1, 11, (3, 4, 5), generator=g).to(dtype)
    _check(lambda s, v: torch.searchsorted(s, v, right=right), seq, v)
    _check(lambda s, v: torch.searchsorted(s[0, 0], v, right=right, out_int32=True), seq, v)
    _check(lambda s: torch.searchsorted(s[0, 0], 3, right=right), seq)
    _check(lambda s: torch.searchsorted(s[0, 0], 2.5, side="right" if right else "left"), seq)
    perm = torch.argsort(torch.randn(3, 4, 9, generator=g), -1)
    unsorted = torch.empty_like(seq).scatter_(-1, perm, seq)
    _check(lambda s, v: torch.searchsorted(s, v, sorter=perm, right=right), unsorted, v)


def test_searchsorted_nan_and_empty():
    # the kernel's binary search around a NaN in the sequence (a count would say 2 for 1.5)
    _check(torch.searchsorted, torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([1.5, float("nan"), 5.0, 2.0]))
    _check(torch.searchsorted, torch.tensor([]), torch.tensor([1.5]))
    _check(torch.searchsorted, torch.arange(7.0), torch.tensor([[1.5, 6.5], [0.0, 7.0]]).t())


def test_bincount():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 8, (30,), generator=g)
    _check(torch.bincount, x)
    _check(lambda x: torch.bincount(x, minlength=12), x)
    _check(torch.bincount, torch.tensor([], dtype=torch.int64))
    _check(torch.bincount, x.to(torch.uint8))
    for dtype in (torch.float32, torch.float64, torch.int64):  # float32 stays, the rest sum in float64
        w = torch.randn(30, generator=g).mul(5).to(dtype)
        _check(lambda x: torch.bincount(x, w), x)
    with pytest.raises(RuntimeError, match="non-negative"), ed.EagerDecompMode("core_aten"):
        torch.bincount(torch.tensor([1, -1]))


def test_repeat_interleave():
    _check(torch.repeat_interleave, torch.tensor([0, 2, 0, 1, 0]))  # zero repeats stack
    _check(torch.repeat_interleave, torch.tensor([3, 1], dtype=torch.int32))
    _check(torch.repeat_interleave, torch.tensor([0, 0]))
    _check(torch.repeat_interleave, torch.tensor([], dtype=torch.int64))
    _check(lambda x: torch.repeat_interleave(x, torch.tensor([1, 0, 2]), dim=0), torch.randn(3, 2))
    _check(lambda x: x.repeat_interleave(torch.tensor([1, 3]), dim=1, output_size=4), torch.randn(3, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(dtype, reduce, include_self):
    g = torch.Generator().manual_seed(0)
    s, src = (torch.randn(5, 4, 3, generator=g) * 5).to(dtype), (torch.randn(5, 6, 3, generator=g) * 5).to(dtype)
    idx = torch.randint(0, 4, (6,), generator=g)
    _check(lambda s, src: s.index_reduce(1, idx, src, reduce, include_self=include_self), s, src)
    _check(lambda s, src: s.index_reduce(0, idx[:2], src[:2, :4], reduce, include_self=include_self), s, src)
    _check(
        lambda s, src: s.index_reduce(0, torch.tensor([0]), src, reduce, include_self=include_self),
        torch.tensor(2.0).to(dtype),
        torch.tensor(3.0).to(dtype),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_value_reduce(dtype, reduce):
    g = torch.Generator().manual_seed(0)
    s, idx = (torch.randn(4, 5, generator=g) * 5).to(dtype), torch.randint(0, 4, (3, 5), generator=g)
    _check(lambda s: s.scatter(0, idx, 2, reduce=reduce), s)
    _check(lambda s: s.scatter(1, idx[:, :3], 1.5 if dtype.is_floating_point else 3, reduce=reduce), s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_trilinear(dtype):
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(4, 3, dtype=dtype, generator=g), torch.randn(4, 5, dtype=dtype, generator=g)
    w, b = torch.randn(6, 3, 5, dtype=dtype, generator=g), torch.randn(6, dtype=dtype, generator=g)
    _check(F.bilinear, x1, x2, w, b)
    _check(
        F.bilinear, torch.randn(2, 7, 3, dtype=dtype, generator=g), torch.randn(2, 7, 5, dtype=dtype, generator=g), w
    )
    tri = torch._C._VariableFunctions._trilinear
    for sumdim in ([2, 3], [], [3]):
        _check(lambda a, c, d: tri(a, c, d, [1, 3], [0], [1, 2], sumdim), x1, w, x2)


AS_STRIDED = [  # self, src shape, size, stride, offset
    ((3, 3), (2, 2), (1, 2), 0),
    ((3, 3), (2, 2), (1, 2), 1),
    ((3, 3), (2, 2), (2, 1), 0),
    ((16,), (2, 2, 2, 2), (8, 4, 2, 1), 0),
    ((16,), (2, 1, 1, 2), (1, 2, 4, 8), 0),
    ((2, 4), (2, 3), (3, 1), 2),
    ((2, 4), (0, 3), (3, 1), 2),
]


@pytest.mark.parametrize("case", AS_STRIDED)
def test_as_strided_scatter(case):
    shape, size, stride, offset = case
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(*shape, generator=g), torch.randn(*size, generator=g)
    _check(lambda x, s: torch.as_strided_scatter(x, s, size, stride, offset), x, src)
    _check(lambda x, s: torch.as_strided_scatter(x, s, size, stride, offset), x, src.double())  # cast on copy


def test_as_strided_scatter_keeps_strides():
    # a transposed self: its clone keeps the strides, and the view indexes that storage
    _check(lambda x, s: torch.as_strided_scatter(x, s, (2,), (1,), 0), torch.randn(3, 4).t(), torch.ones(2))


@pytest.mark.parametrize(
    "make, size, stride, offset",
    [
        (lambda: torch.randn(12)[2:8].view(2, 3), (2,), (1,), 3),  # positions count from the storage's start
        (lambda: torch.randn(3, 8)[:, 1::3], (2,), (1,), 0),  # the first lands in a gap before self
        (lambda: torch.randn(4, 10)[:, ::2], (3, 2), (2, 1), 1),  # a strided self keeps its gaps
        (lambda: torch.randn(2, 3, 8, 5).contiguous(memory_format=torch.channels_last)[:, :, ::2], (3, 2), (2, 1), 1),
        (lambda: torch.randn(3, 1).expand(3, 4), (2, 2), (2, 1), 0),  # overlapping: cloned dense first
    ],
)
def test_as_strided_scatter_of_views(make, size, stride, offset):
    # eager clones self's whole storage and views it as self (strides and storage offset kept)
    x = make()
    _check(lambda x, s: torch.as_strided_scatter(x, s, size, stride, offset), x, torch.ones(size))
    want = torch.as_strided_scatter(x, torch.ones(size), size, stride, offset)
    with ed.EagerDecompMode("core_aten"):
        got = torch.as_strided_scatter(x, torch.ones(size), size, stride, offset)
    assert got.storage_offset() == want.storage_offset()


def _check_all(fn, *args):
    check_against_eager(fn, *args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_along_dim(dtype, dim):
    x = torch.randint(0, 2, (4, 9, 3), generator=torch.Generator().manual_seed(0)).to(dtype)
    for inverse, counts in ((False, False), (True, True), (True, False)):
        _check_all(lambda t: torch.unique_consecutive(t, return_inverse=inverse, return_counts=counts, dim=dim), x)
        _check_all(lambda t: torch.unique(t, return_inverse=inverse, return_counts=counts, dim=dim), x)
    _check_all(lambda t: torch.unique_consecutive(t, dim=1), x[:, :0])  # no slices
    _check_all(lambda t: torch.unique(t, dim=1, return_counts=True), x[:, :0])


def test_unique_along_dim_nan():
    xs = torch.tensor([[1.0, float("nan"), 1.0], [1.0, float("nan"), 1.0]])
    _check_all(lambda t: torch.unique_consecutive(t, dim=1, return_counts=True), xs)  # NaN: its own run
    with pytest.raises(ed.UnsupportedOpError), ed.EagerDecompMode("core_aten"):  # the kernel's sort order is undefined
        torch.unique(xs, dim=1)


@pytest.mark.parametrize("size,fill", [(4, -1), (1, 7), (2, 0), (0, -1)])
def test_nonzero_static(size, fill):
    _check(lambda t: torch.nonzero_static(t, size=size, fill_value=fill), torch.tensor([[1, 0], [0, 1]]))
    _check(lambda t: torch.nonzero_static(t, size=size), torch.tensor([1.0, 0.0, 3.0]))
