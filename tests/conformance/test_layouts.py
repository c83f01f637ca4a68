"""Conformance at other layouts: each OpInfo sample with its tensors laid out as users' often are.

OpInfo samples are contiguous; eager kernels choose their outputs' strides from their
inputs', and meta kernels (which a trace checks against) do not always choose alike. Each
sample runs again with every tensor copied into one of :data:`LAYOUTS` (same values,
other strides), through the same harness, the same comparisons (values, dtype, shape,
significant strides, aliasing, written inputs) and the same expected failures as
:mod:`test_opinfo`; a ``wrong`` outcome fails the test.

``EAGERDECOMP_CONFORMANCE=full`` (``make conformance``) runs every OpInfo at float32
and float64 on :data:`FULL_SAMPLES` samples; ``make test`` runs a stable ~1/8 of the OpInfos
at one dtype on their first :data:`SLICE_SAMPLES` samples (``EAGERDECOMP_LAYOUTS_EVERY=1``: all).
"""

from __future__ import annotations

import itertools
import os
import warnings
import zlib

import pytest
import torch

from .conftest import FULL, _op_db, dtype_name
from .harness import run_sample
from .xfail import expected_for, explains

FAILING = ("unsupported", "wrong", "error")
SLICE_SAMPLES, FULL_SAMPLES = 2, 4
SLICE_EVERY = int(os.environ.get("EAGERDECOMP_LAYOUTS_EVERY", "16"))


def _column_major(t):
    """The last two dimensions swapped in memory (a transposed, dense tensor)."""
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


def _strided(t):
    """Every other element of a buffer twice as long in the last dimension (not dense)."""
    out = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)[..., ::2]
    return out.copy_(t)


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else _column_major(t)


LAYOUTS = {"column-major": _column_major, "strided": _strided, "channels-last": _channels_last}


def _relaid(sample, layout):
    """``sample`` with each tensor of 2+ dimensions (1+ for strided) copied into ``layout``."""
    fn = LAYOUTS[layout]
    least = 1 if layout == "strided" else 2

    def move(t):
        if not isinstance(t, torch.Tensor) or t.dim() < least or t.numel() == 0 or t.layout != torch.strided:
            return t
        out = fn(t.detach())
        return out.requires_grad_(t.requires_grad) if out.is_floating_point() or out.is_complex() else out

    return sample.transform(move)


# NOTE: where eager itself is wrong at another layout, that variant's outcome is not held
# against the mode; a test of its own checks the mode against the functional op instead
EAGER_WRONG = {
    ("native_batch_norm", "out"): "eager's out= kernel writes a non-contiguous input's statistics as garbage "
    "(test_native_batch_norm_out_matches_the_functional_op)",
}


def _excused(opinfo, outcome) -> bool:
    return (opinfo.name, outcome.variant) in EAGER_WRONG


def _params() -> list:
    out = []
    for opinfo in _op_db():
        if not FULL and zlib.crc32(opinfo.full_name.encode()) % SLICE_EVERY:
            continue
        dtypes = [d for d in (torch.float32, torch.float64) if d in opinfo.supported_dtypes("cpu")]
        for dtype in dtypes if FULL else dtypes[:1]:
            out.append(pytest.param(opinfo, dtype, id=f"{opinfo.full_name}-{dtype_name(dtype)}"))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("opinfo,dtype", _params())
def test_layout(opinfo, dtype, layout):
    name, dname = opinfo.full_name, dtype_name(dtype)
    requires_grad = dtype == torch.float64 and opinfo.supports_autograd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(
            itertools.islice(
                opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad), FULL_SAMPLES if FULL else SLICE_SAMPLES
            )
        )
    entries = expected_for(name, dname)
    problems, moved = [], 0
    for i, sample in enumerate(samples):
        relaid = _relaid(sample, layout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcomes = run_sample(opinfo, relaid, dtype)
        moved += 1
        for outcome in outcomes:
            if _excused(opinfo, outcome):
                continue
            if outcome.cls in FAILING and not any(explains(e, outcome) for e in entries):
                problems.append(f"sample {i} [{outcome.variant}] {outcome.cls}: {outcome.detail}")
    if not moved:
        pytest.skip("no samples")
    assert not problems, f"{name} at {dname}, {layout}:\n  " + "\n  ".join(problems[:20])


def test_native_batch_norm_out_matches_the_functional_op():
    import eagerdecomp as ed

    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = _column_major(torch.randn(5, 5, 5, generator=g))
    w, b, mean, var = (
        torch.randn(5, generator=g),
        torch.randn(5, generator=g),
        torch.randn(5, generator=g),
        torch.rand(5, generator=g),
    )
    want = aten.native_batch_norm.default(x.contiguous(), w, b, mean.clone(), var.clone(), True, 0.1, 1e-5)
    outs = [torch.empty(0) for _ in range(3)]
    with ed.EagerDecompMode("core_aten"):
        aten.native_batch_norm.out(
            x, w, b, mean.clone(), var.clone(), True, 0.1, 1e-5, out=outs[0], save_mean=outs[1], save_invstd=outs[2]
        )
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def _ti_inputs(kind):
    """Operands whose TensorIterator layout the Python meta kernels of some ops get wrong."""
    g = torch.Generator().manual_seed(0)
    make = {
        "cm": lambda: _column_major(torch.rand(10, 5, generator=g) + 0.5),
        "c": lambda: torch.rand(10, 5, generator=g) + 0.5,
        "0d": lambda: torch.tensor(1.5),
        "row": lambda: torch.rand(5, generator=g) + 0.5,
        "cl": lambda: torch.rand(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last) + 0.5,
    }
    return [make[k]() for k in kind.split(",")]


_aten = torch.ops.aten


# NOTE: found by comparing every binary op's meta kernel with its CPU kernel at these layouts
# (eagerdecomp/exact.py's _META_LAYOUT_FIXES); each row failed before the fix
@pytest.mark.parametrize(
    "op, out_op, kind, kwargs",
    [
        (_aten.copysign.Tensor, _aten.copysign.out, "cm,row", {}),
        (_aten.copysign.Tensor, _aten.copysign.out, "cl,0d", {}),
        (_aten.floor_divide.default, _aten.floor_divide.out, "cm,row", {}),
        (_aten.div.Tensor_mode, _aten.div.out_mode, "cm,row", {"rounding_mode": "floor"}),
        (_aten.heaviside.default, _aten.heaviside.out, "0d,cm", {}),
        (_aten.logaddexp.default, _aten.logaddexp.out, "0d,cm", {}),
        (_aten.logaddexp2.default, _aten.logaddexp2.out, "row,cm", {}),
        (_aten.xlogy.Tensor, _aten.xlogy.OutTensor, "cm,c", {}),
        (_aten.xlogy.Tensor, _aten.xlogy.OutTensor, "c,cm", {}),
        (_aten.hardsigmoid_backward.default, None, "cm,c", {}),
        (_aten.hardswish_backward.default, _aten.hardswish_backward.out, "cm,c", {}),
        (_aten.isin.Tensor_Tensor, _aten.isin.Tensor_Tensor_out, "cm,row", {}),
        (_aten.igamma.default, _aten.igamma.out, "cm,0d", {}),
        (_aten.igammac.default, _aten.igammac.out, "cm,row", {}),
    ],
)
def test_tensor_iterator_layouts(op, out_op, kind, kwargs):
    import eagerdecomp as ed
    from eagerdecomp.testing import RecordingMode

    args = _ti_inputs(kind)
    want = op(*args, **kwargs)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = op(*args, **kwargs)
    rec.assert_only("core_aten")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want, equal_nan=True)
    if out_op is not None:
        want_out, got_out = torch.empty(0, dtype=want.dtype), torch.empty(0, dtype=want.dtype)
        out_op(*args, **kwargs, out=want_out)
        with ed.EagerDecompMode("core_aten"):
            out_op(*args, **kwargs, out=got_out)
        assert got_out.stride() == want_out.stride()
        torch.testing.assert_close(got_out, want_out, equal_nan=True)


# NOTE: out= kernels whose resized out takes the functional result's strides though neither
# TensorIterator-structured nor pointwise: sort and avg_pool2d (structured), where and
# floor_divide (unstructured TensorIterators), addr (unmarked); each failed without its rule
@pytest.mark.parametrize("name", ["sort", "addr", "avg_pool2d", "where", "floor_divide"])
def test_resized_out_takes_the_functional_layout(name):
    import eagerdecomp as ed

    g = torch.Generator().manual_seed(0)
    x = _column_major(torch.randn(6, 5, generator=g))
    v1, v2 = torch.randn(6, generator=g), torch.randn(5, generator=g)
    image = torch.randn(2, 3, 6, 6, generator=g).contiguous(memory_format=torch.channels_last)
    cube = _column_major(torch.randn(5, 5, 5, generator=g))
    calls = {
        "sort": lambda o: _aten.sort.values_stable(cube, stable=True, dim=0, values=o[0], indices=o[1]),
        "addr": lambda o: _aten.addr.out(x, v1, v2, out=o[0]),
        "avg_pool2d": lambda o: _aten.avg_pool2d.out(image, [2, 2], out=o[0]),
        "where": lambda o: _aten.where.self_out(x > 0, x, torch.zeros(5), out=o[0]),
        "floor_divide": lambda o: _aten.floor_divide.out(x, torch.tensor(0.7), out=o[0]),
    }
    want, got = ([torch.empty(0), torch.empty(0, dtype=torch.long)] for _ in range(2))
    calls[name](want)
    with ed.EagerDecompMode("core_aten"):
        calls[name](got)
    for w, o in zip(want, got if name == "sort" else got[:1]):
        assert o.stride() == w.stride()
        torch.testing.assert_close(o, w)
