"""cumsum and cumprod under the prims presets (decompositions/scans.py): log-step scans, against
native eager (values, dtypes, strides, out= and in-place forms, errors), with the witness checking
that only the preset's ops ran, and no intermediate larger than the input (the ref's was n x n)."""

import pytest
import torch

import eagerdecomp as ed
from tests.compare import assert_raises_like_eager, check_against_eager

aten = torch.ops.aten
PRESETS = ("prims_fusion", "prims")

torch.manual_seed(0)
SHAPES = {"1d-1": (1,), "2d": (5, 37), "3d-odd": (3, 33, 2), "empty": (4, 0), "0d": ()}
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.complex64)
INTS = (torch.int64, torch.int32, torch.bool)


def _input(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        # (near 1 for products: 64 factors stay finite in float16)
        return (1 + 0.1 * torch.randn(shape, dtype=torch.complex64 if dtype.is_complex else torch.float32)).to(dtype)
    return torch.randint(0, 7, shape).to(dtype)


def _result_dtype(x):
    return x.dtype if x.is_floating_point() or x.is_complex() else torch.int64


CALLS = {
    "cumsum": lambda x, d: torch.cumsum(x, d),
    "cumprod": lambda x, d: torch.cumprod(x, d),
    "cumsum-dtype": lambda x, d: torch.cumsum(x, d, dtype=torch.float64),
    "cumsum-out": lambda x, d: torch.cumsum(x, d, out=torch.empty(0, dtype=_result_dtype(x))),
    "cumsum_": lambda x, d: x.clone().cumsum_(d) if x.is_floating_point() else x.cumsum(d),
    "transposed": lambda x, d: torch.cumsum(x.t() if x.dim() == 2 else x, d),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("call", CALLS)
def test_scans_like_eager(preset, shape, dtype, call):
    if preset == "prims" and dtype not in (torch.float32, torch.int64):
        pytest.skip("the same scan as under prims_fusion: two dtypes suffice")
    x = _input(SHAPES[shape], dtype)
    dims = [-1, 0] if x.dim() else [0]
    for d in dims:
        exact = not (dtype.is_floating_point or dtype.is_complex)  # (integers: bit for bit)
        check_against_eager(CALLS[call], x, d, opset=preset, exact=exact)


def test_integers_wrap_as_eager_in_any_order():
    x = torch.full((100,), 2**40, dtype=torch.int64)
    check_against_eager(lambda: (torch.cumsum(x, 0), torch.cumprod(x, 0)), opset="prims_fusion")


@pytest.mark.parametrize("dim", [2, -3])
def test_a_dim_out_of_range_raises_eagers_error(dim):
    x = torch.randn(3, 4)
    assert_raises_like_eager(lambda: torch.cumsum(x, dim), opset="prims_fusion", message=True)


def test_no_intermediate_grows_with_the_square_of_the_length():
    # the ref masked an [n, n] copy of the input: 200,000 elements asked for 160 GB in float32
    n = 200_000
    x = torch.ones(n)
    biggest = []

    class Sizes(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                biggest.append(out.numel())
            return out

    with Sizes(), ed.EagerDecompMode("prims_fusion"):
        got = torch.cumsum(x, 0)
    assert torch.equal(got, torch.arange(1, n + 1, dtype=torch.float32))  # (exact: small integers)
    assert max(biggest) <= 2 * n


def test_gradients_like_eager():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)

    def grads(x):
        y = (torch.cumsum(x, 1) * torch.cumprod(x, 0)).sum()
        return torch.autograd.grad(y, x)

    check_against_eager(grads, x, opset="prims_fusion", exact=False)
