"""Core ATen ops that had no path to ``prims_fusion`` (decompositions/prims_misc.py), and randperm
and nonzero, library ops of the preset (ops/opset.py).

Every call is compared with native eager under ``EagerDecompMode("prims_fusion")`` (values,
dtype, shape, strides), the witness checking that only the preset's ops reached the kernels;
eager's errors are compared too. Core ATen keeps these ops, so the same calls there pass through.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from tests.compare import assert_raises_like_eager, check_against_eager

aten = torch.ops.aten
PRESET = "prims_fusion"

torch.manual_seed(0)
X5 = torch.randn(2, 3, 5, 6, 7)
XI = torch.randint(-100, 100, (2, 3, 5, 6, 7))
A, B, C, D = torch.randn(3, 4), torch.randn(5, 4), torch.randn(2, 3, 4), torch.randn(30, 4)


def _seeded(fn):
    def draw():
        torch.manual_seed(7)
        out = fn()
        return out, torch.rand(3)  # the generator ends where eager's does

    return draw


RANDPERM = {
    "small": lambda: torch.randperm(10),
    "int32": lambda: torch.randperm(100, dtype=torch.int32),
    "float": lambda: torch.randperm(33, dtype=torch.float32),
    "out": lambda: torch.randperm(12, out=torch.empty(0, dtype=torch.int16)),
    "generator": lambda: torch.randperm(9, generator=torch.Generator().manual_seed(3)),
}


@pytest.mark.parametrize("name", list(RANDPERM))
def test_randperm_is_eagers_stream(name):
    check_against_eager(_seeded(RANDPERM[name]), opset=PRESET)


M = torch.randn(4, 5, 6)
MASKED = {
    "bool-index": lambda: M[M > 0],
    "bool-index-rows": lambda: M[M[:, 0, 0] > 0],
    "bool-index-put": lambda: M.clone().index_put_((M < 0,), torch.tensor(0.0)),
    "where-one-arg": lambda: torch.where(M > 0.5),
    "masked-select": lambda: torch.masked_select(M, M.sum(-1, keepdim=True) > 0),
    "nonzero-strided": lambda: torch.nonzero(M.transpose(0, 2) > 0),
    "nonzero-empty": lambda: torch.nonzero(torch.zeros(3, 0)),
    "nonzero-out": lambda: torch.nonzero(M > 1, out=torch.empty(0, dtype=torch.long)),
    "nonzero-gradient": lambda: _masked_grad(M.clone().requires_grad_()),
}


def _masked_grad(x):
    return torch.autograd.grad(x[x > 0].exp().sum(), x)[0]


@pytest.mark.parametrize("name", list(MASKED))
def test_boolean_mask_indexing_like_eager(name):
    check_against_eager(MASKED[name], opset=PRESET)


POOLS = {
    "avg": lambda: F.avg_pool3d(X5, 2),
    "avg-4d": lambda: F.avg_pool3d(X5[0], 3, 2, 1),
    "avg-ceil-exclude-pad": lambda: F.avg_pool3d(X5, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg-ceil-include-pad": lambda: F.avg_pool3d(X5, (3, 2, 3), (2, 1, 2), (1, 1, 0), ceil_mode=True),
    "avg-divisor": lambda: F.avg_pool3d(X5, 3, 2, 1, divisor_override=5),
    "avg-channels-last": lambda: F.avg_pool3d(X5.to(memory_format=torch.channels_last_3d), 2),
    "avg-float64": lambda: F.avg_pool3d(X5.double(), (1, 2, 3)),
    "avg-inf": lambda: F.avg_pool3d(torch.tensor([1.0, float("inf"), 2, 3]).view(1, 1, 1, 1, 4), (1, 1, 2)),
    "adaptive": lambda: F.adaptive_avg_pool3d(X5, (2, 3, 3)),
    "adaptive-4d-upsizing": lambda: F.adaptive_avg_pool3d(X5[0], (7, 4, 9)),
    "adaptive-channels-last": lambda: F.adaptive_avg_pool3d(X5.to(memory_format=torch.channels_last_3d), (4, 4, 5)),
    "avg-empty-batch": lambda: F.avg_pool3d(torch.randn(0, 2, 4, 4, 4), 2),
    "adaptive-empty-batch": lambda: F.adaptive_avg_pool3d(torch.randn(0, 2, 4, 4, 4), 2),
    "adaptive-no-channels-4d": lambda: F.adaptive_avg_pool3d(torch.randn(0, 4, 4, 4), 2),
    "adaptive-empty-output": lambda: F.adaptive_avg_pool3d(
        torch.randn(2, 2, 4, 4, 4).to(memory_format=torch.channels_last_3d), (0, 2, 2)
    ),
    "adaptive-inf": lambda: F.adaptive_avg_pool3d(
        torch.tensor([1.0, float("inf"), 2, 3, 4]).view(1, 1, 1, 1, 5), (1, 1, 3)
    ),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_3d_average_pooling_like_eager(name):
    check_against_eager(POOLS[name], opset=PRESET, exact=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaptive_pooling_in_reduced_precision_like_eager(dtype):
    # (the input an argument: the accuracy rule's float64 run upcasts it)
    check_against_eager(lambda x: F.adaptive_avg_pool3d(x, 3), X5.to(dtype), opset=PRESET, exact=False)


INT_POOLS = {
    "plain": lambda: F.avg_pool3d(XI, 2),
    "divisor": lambda: F.avg_pool3d(XI, 3, 2, 1, divisor_override=7),  # C++'s division: toward zero
    "exclude-pad": lambda: F.avg_pool3d(XI, 3, 2, 1, ceil_mode=True, count_include_pad=False),
}


@pytest.mark.parametrize("name", list(INT_POOLS))
def test_int64_average_pooling_is_exact(name):
    check_against_eager(INT_POOLS[name], opset=PRESET)


def test_3d_pooling_gradients_like_eager():
    def step(pool):
        x = X5.clone().requires_grad_()
        out = pool(x)
        out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
        return out.detach(), x.grad

    for pool in (lambda x: F.adaptive_avg_pool3d(x, 3), lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True)):
        check_against_eager(lambda pool=pool: step(pool), opset=PRESET, exact=False)


POOL_ERRORS = {
    "avg-bfloat16": lambda: F.avg_pool3d(X5.bfloat16(), 2),
    "avg-int32": lambda: F.avg_pool3d(XI.int(), 2),
    "avg-kernel-too-big": lambda: F.avg_pool3d(X5, 9),
    "avg-padding-past-half": lambda: F.avg_pool3d(X5, 2, padding=2),
    "adaptive-int64": lambda: F.adaptive_avg_pool3d(XI, 2),
    "adaptive-no-channels": lambda: F.adaptive_avg_pool3d(torch.randn(2, 0, 4, 4, 4), 2),
    "adaptive-empty-depth": lambda: F.adaptive_avg_pool3d(torch.randn(2, 2, 0, 4, 4), 2),
}


@pytest.mark.parametrize("name", list(POOL_ERRORS))
def test_3d_pooling_errors_like_eager(name):
    assert_raises_like_eager(POOL_ERRORS[name], opset=PRESET)


CDIST = {
    "p2-exact-path": lambda: torch.cdist(A, B),
    "p2-mm-past-25-rows": lambda: torch.cdist(D, B),
    "p2-use-mm": lambda: torch.cdist(A, B, compute_mode="use_mm_for_euclid_dist"),
    "p2-no-mm": lambda: torch.cdist(D, B, compute_mode="donot_use_mm_for_euclid_dist"),
    "p1-batched-broadcast": lambda: torch.cdist(C, B, p=1),
    "p0": lambda: torch.cdist(A, B, p=0),
    "p1.5": lambda: torch.cdist(A, B, p=1.5),
    "p3-float64": lambda: torch.cdist(A.double(), B.double(), p=3),
    "pinf": lambda: torch.cdist(A, B, p=float("inf")),
    "no-columns": lambda: torch.cdist(torch.randn(2, 0), torch.randn(3, 0)),
    "no-rows": lambda: torch.cdist(torch.randn(0, 3), torch.randn(3, 3)),
    "no-rows-mixed": lambda: torch.cdist(torch.randn(0, 4), B.double()),
}


@pytest.mark.parametrize("name", list(CDIST))
def test_cdist_like_eager(name):
    check_against_eager(CDIST[name], opset=PRESET, exact=False)


def test_cdist_gradient_like_eager():
    def step():
        x, y = A.clone().requires_grad_(), B.clone().requires_grad_()
        torch.cdist(x, y, p=1.5).sum().backward()
        return x.grad, y.grad

    check_against_eager(step, opset=PRESET, exact=False)


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.cdist(A, torch.randn(3, 5)),
        lambda: torch.cdist(A, B, p=-1),
        lambda: torch.cdist(A.long(), B.long()),
        lambda: torch.cdist(A, B.long()),
        lambda: torch.cdist(A, B.double()),
        lambda: torch.cdist(D, B.double()),
        lambda: torch.cdist(A.half(), B.half()),
    ],
    ids=["columns", "negative-p", "integers", "integer-x2", "mixed", "mixed-mm", "half"],
)
def test_cdist_errors_like_eager(fn):
    assert_raises_like_eager(fn, opset=PRESET)


PDIST = {
    "p2": lambda: F.pdist(D),
    "p0": lambda: F.pdist(A, 0),
    "p1-float64": lambda: F.pdist(D.double(), 1),
    "p1.5": lambda: F.pdist(A, 1.5),
    "pinf": lambda: F.pdist(B, float("inf")),
    "transposed-input": lambda: F.pdist(A.t()),  # (pdist makes it contiguous first)
    "one-row": lambda: F.pdist(A[:1]),
    "no-rows": lambda: F.pdist(A[:0]),
    "no-columns": lambda: F.pdist(A[:, :0]),
}


@pytest.mark.parametrize("name", list(PDIST))
def test_pdist_like_eager(name):
    check_against_eager(PDIST[name], opset=PRESET, exact=False)


def test_pdist_gradient_like_eager():
    def step():
        x = D.double().clone().requires_grad_()
        F.pdist(x, 3).sum().backward()
        return x.grad

    check_against_eager(step, opset=PRESET, exact=False)


@pytest.mark.parametrize(
    "fn",
    [lambda: aten._pdist_forward.default(A.t(), 2.0), lambda: F.pdist(A, -1), lambda: F.pdist(C)],
    ids=["non-contiguous", "negative-p", "3d"],
)
def test_pdist_errors_like_eager(fn):
    assert_raises_like_eager(fn, opset=PRESET, message=True)


# NaN first in a bag (it stays) and later (never taken), ties, empty bags, an all-padding bag
W = torch.tensor([[1.0, 5.0], [float("nan"), 2.0], [3.0, 5.0], [float("nan"), 9.0], [0.0, 0.0]])
IDX = torch.tensor([0, 1, 2, 3, 2, 0, 4, 4, 1, 0])
OFFSETS = {False: torch.tensor([0, 4, 4, 6, 8]), True: torch.tensor([0, 4, 4, 6, 8, 10])}
PSW = torch.arange(10.0) / 3
BAGS = [
    (mode, pad, last, dtype, weighted)
    for mode, pad, last, dtype, weighted in itertools.product(
        (0, 1, 2), (-1, 0, 4), (False, True), (torch.float32, torch.float64, torch.float16), (False, True)
    )
    if mode == 0 or not weighted
]


@pytest.mark.parametrize("mode,pad,last,dtype,weighted", BAGS)
def test_embedding_bag_like_eager(mode, pad, last, dtype, weighted):
    # all four outputs: the bag results and the bookkeeping the backward reads
    def bag():
        psw = PSW.to(dtype) if weighted else None
        return aten._embedding_bag(W.to(dtype), IDX, OFFSETS[last], False, mode, False, psw, last, pad)

    check_against_eager(bag, opset=PRESET, exact=mode == 2)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_module_trains_like_eager(mode):
    weight = torch.randn(10, 3)
    x = torch.tensor([[1, 2, 4], [4, 3, 2], [9, 1, 1], [0, 7, 7]])

    def step():
        bag = torch.nn.EmbeddingBag(10, 3, mode=mode, _weight=weight.clone())
        out = bag(x, offsets=None, per_sample_weights=None)
        out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
        return out.detach(), bag.weight.grad

    check_against_eager(step, opset=PRESET, exact=False)


def test_embedding_bag_int32_indices_like_eager():
    check_against_eager(
        lambda: aten._embedding_bag(W, IDX.int(), OFFSETS[False].int(), False, 1, False, None, False, -1),
        opset=PRESET,
        exact=False,
    )


def _bag(indices, offsets, mode=0):
    return lambda: aten._embedding_bag(
        W, torch.tensor(indices), torch.tensor(offsets), False, mode, False, None, False, -1
    )


BAG_ERRORS = {
    "first-offset-not-0": (_bag([0, 1, 2], [1, 2]), "class"),
    "first-offset-not-0-int32": (
        lambda: aten._embedding_bag(
            W, IDX.int(), torch.tensor([1, 2], dtype=torch.int32), False, 1, False, None, False, -1
        ),
        "class",
    ),
    "offset-past-the-input": (_bag([0, 1, 2], [0, 5], 1), "class"),
    "index-past-the-rows-max": (_bag([0, 7, -1], [0, 2], 2), "class"),
    "negative-index-max": (_bag([0, -1, 7], [0, 2], 2), "class"),
    # the sum and mean kernels word it by their code path: eager's type, not its words
    "index-past-the-rows-sum": (_bag([0, 7, 2], [0, 2], 0), None),
}


@pytest.mark.parametrize("name", list(BAG_ERRORS))
def test_embedding_bag_errors_like_eager(name):
    fn, message = BAG_ERRORS[name]
    assert_raises_like_eager(fn, opset=PRESET, message=message)


def test_embedding_bag_decreasing_offsets_declined():
    # eager reads past its bags without a check (undefined: it returned values in one run and
    # raised an internal assert in another); the mode refuses rather than guess
    fn = _bag([0, 1, 2], [0, 2, 1], 1)
    with pytest.raises(ed.EagerDecompError, match="declined"), ed.EagerDecompMode(PRESET):
        fn()


def test_core_aten_keeps_these_ops():
    # the decompositions serve opsets without the ops (nothing changes under core ATen, which runs
    # each op itself); randperm is an op of both presets
    core, fusion = ed.OpSet.preset("core_aten"), ed.OpSet.preset(PRESET)
    for op in (
        aten.avg_pool3d.default,
        aten._adaptive_avg_pool3d.default,
        aten._cdist_forward.default,
        aten._pdist_forward.default,
        aten._embedding_bag.default,
        aten.min.dim,
        aten.argmin.default,
    ):
        assert op in core and op not in fusion, op
    assert aten.randperm.default in core and aten.randperm.default in fusion


def test_on_edprims_like_cpu():
    # one fresh process (this suite's register edref; one reference device per process): the
    # device is strict (a kernel for each preset op only), and its op log is a second witness
    from tests.device.test_primsdev import _run

    out = _run(
        """
        import json
        import torch
        import torch.nn.functional as F
        import eagerdecomp as ed
        from eagerdecomp.device import refdev
        from eagerdecomp.testing import prims_reference_device

        dev = prims_reference_device()
        ed.enable(dev, "prims_fusion")
        torch.manual_seed(0)
        x5, a, b = torch.randn(2, 3, 5, 6, 7), torch.randn(3, 4), torch.randn(5, 4)
        w = torch.tensor([[1.0, 5.0], [float("nan"), 2.0], [3.0, 5.0], [float("nan"), 9.0], [0.0, 0.0]])
        idx, off = torch.tensor([0, 1, 2, 3, 2, 0, 4, 4, 1, 0]), torch.tensor([0, 4, 4, 6, 8])
        cases = {
            "randperm": lambda d: (torch.manual_seed(5), torch.randperm(20, device=d))[1],
            "avg_pool3d": lambda d: F.avg_pool3d(x5.to(d), 3, 2, 1),
            "adaptive_avg_pool3d": lambda d: F.adaptive_avg_pool3d(x5.to(d), 3),
            "cdist": lambda d: torch.cdist(a.to(d), b.to(d), p=1.5),
            "embedding_bag-max": lambda d: F.embedding_bag(idx.to(d), w.to(d), off.to(d), mode="max"),
            "embedding_bag-mean": lambda d: F.embedding_bag(idx.to(d), w.to(d), off.to(d), mode="mean"),
            "nonzero": lambda d: torch.nonzero(a.to(d) > 0),
            "bool-index": lambda d: x5.to(d)[x5.to(d) > 1],
            "rfft-irfft": lambda d: torch.fft.irfft(torch.fft.rfft(x5.to(d), norm="ortho"), n=7),
            "pdist": lambda d: F.pdist(b.to(d), 1.5),
        }
        res = {"diff": {}}
        with refdev.op_log() as ran:
            for name, fn in cases.items():
                want, got = fn("cpu"), fn(dev).cpu()
                same = torch.isnan(want).eq(torch.isnan(got)).all().item() and want.dtype == got.dtype
                res["diff"][name] = (got - want).nan_to_num().abs().max().item() if same else None
        res["ran"] = sorted(ran)
        res["kernels"] = sorted(n.removeprefix("aten::") for n in refdev.device_ops("edprims").names())
        print(json.dumps(res))
        """
    )
    assert set(out["ran"]) <= set(out["kernels"]), sorted(set(out["ran"]) - set(out["kernels"]))
    for name, diff in out["diff"].items():
        exact = name.startswith(("randperm", "embedding_bag-max", "nonzero", "bool"))
        assert diff is not None and diff <= (0 if exact else 1e-5), name


def test_cdist_half_on_the_mm_path_like_eager():
    # (the input an argument: the accuracy rule's float64 run upcasts it)
    check_against_eager(lambda x, y: torch.cdist(x, y), D.half(), B.half(), opset=PRESET, exact=False)


# -- the minimum's position (min.dim, argmin through max.dim and argmax) -----------------------------

_G = torch.Generator().manual_seed(3)
MIN_INPUTS = {
    "float32": torch.randn(4, 6, generator=_G),
    "ties-signed-zeros": torch.tensor([[0.0, -0.0, 1.0, -0.0], [2.0, 2.0, 5.0, 2.0]]),
    "nan": torch.tensor([[1.0, float("nan"), 0.0, float("nan")], [float("inf"), -float("inf"), 3.0, -float("inf")]]),
    "float64-transposed": torch.randn(6, 4, dtype=torch.float64, generator=_G).t(),
    "bfloat16": torch.randn(3, 5, generator=_G).to(torch.bfloat16),
    "int64-extremes": torch.tensor([[-(2**63), 5, -(2**63)], [2**63 - 1, 3, 3]]),
    "int8": torch.randint(-128, 128, (4, 7), generator=_G, dtype=torch.int8),
    "uint8": torch.randint(0, 256, (4, 7), generator=_G, dtype=torch.uint8),
    "bool": torch.rand(4, 5, generator=_G) > 0.5,
    "3d": torch.randint(0, 3, (2, 3, 4), generator=_G).float(),
    "0d": torch.tensor(2.5),
    "empty-other-dim": torch.empty(0, 3),
}


@pytest.mark.parametrize("name", list(MIN_INPUTS))
@pytest.mark.parametrize("keepdim", [False, True])
def test_min_dim_and_argmin_like_eager(name, keepdim):
    x = MIN_INPUTS[name]
    dims = [0, -1] if x.dim() else [0]
    for d in dims:
        if x.dim() and x.shape[d] == 0:
            continue  # (eager's error: test_min_errors_like_eager)
        check_against_eager(lambda: torch.min(x, d, keepdim), opset=PRESET)
        if x.dtype != torch.bool:  # (eager's argmin refuses bool: test_min_errors_like_eager)
            check_against_eager(lambda: torch.argmin(x, d, keepdim), opset=PRESET)
    if x.numel() and x.dtype != torch.bool:
        check_against_eager(lambda: torch.argmin(x), opset=PRESET)


MIN_ERRORS = {
    "min-complex": lambda: torch.min(torch.ones(3, dtype=torch.complex64), 0),
    "argmin-complex": lambda: torch.argmin(torch.ones(3, dtype=torch.complex64)),
    "argmin-bool": lambda: torch.argmin(torch.ones(3, dtype=torch.bool), 0),
    "min-empty-dim": lambda: torch.min(torch.empty(2, 0), -1),
    "argmin-empty-dim": lambda: torch.argmin(torch.empty(2, 0), 1),
    "argmin-empty-no-dim": lambda: torch.argmin(torch.empty(0)),
    "min-dim-out-of-range": lambda: torch.min(torch.ones(2, 3), 4),
}


@pytest.mark.parametrize("name", list(MIN_ERRORS))
def test_min_errors_like_eager(name):
    assert_raises_like_eager(MIN_ERRORS[name], opset=PRESET, message=True)


def test_min_gradients_like_eager():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    check_against_eager(lambda: torch.autograd.grad(torch.min(x, 1).values.sum(), x), opset=PRESET)
