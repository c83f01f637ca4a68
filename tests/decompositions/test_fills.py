"""The issue-18 fills against native eager: forward values and autograd of the native forward."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode


def _both(fn, *inputs, seed=0):
    """``fn``'s outputs and input gradients natively and under the mode (only core ops recorded)."""

    def run():
        xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        torch.manual_seed(seed)
        out = fn(*xs)
        if any(x.requires_grad for x in xs):
            out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape))
        return [out.detach()] + [x.grad for x in xs if x.requires_grad]

    want = run()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = run()
    rec.assert_only("core_aten")
    return want, got


def _close(want, got, rtol, atol):
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)


TOL = {torch.float32: (1e-5, 2e-6), torch.float64: (1e-12, 1e-13)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_backward(dtype, dim):
    torch.manual_seed(0)
    v = torch.randn(6, 4, 3, dtype=dtype, requires_grad=True)
    g = torch.randn([6 if d == 0 else 1 for d in range(3)] if dim == 0 else [1, 1, 3], dtype=dtype, requires_grad=True)
    _close(*_both(lambda v, g: torch._weight_norm(v, g, dim), v, g), *TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_per_sample_weights_backward(dtype, padding_idx):
    torch.manual_seed(0)
    w = torch.randn(10, 5, dtype=dtype)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4, 4])
    psw = torch.randn(8, dtype=dtype, requires_grad=True)
    fn = lambda p: F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=p, padding_idx=padding_idx)  # noqa: E731
    _close(*_both(fn, psw), *TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [dict(size=(9, 4)), dict(scale_factor=(1.7, 2.3))], ids=["size", "scale"])
def test_bicubic_backward(dtype, align_corners, size):
    x = torch.randn(2, 3, 5, 7, dtype=dtype, generator=torch.Generator().manual_seed(0), requires_grad=True)
    fn = lambda x: F.interpolate(x, mode="bicubic", align_corners=align_corners, **size)  # noqa: E731
    _close(*_both(fn, x), *(TOL[dtype] if dtype == torch.float64 else (1e-5, 1e-5)))


CTC = [  # (T, N, C, target lengths, input lengths, 2-D targets, reduction, zero_infinity, lengths as tensors)
    (12, 3, 5, [4, 2, 3], [12, 10, 7], True, "mean", False, False),
    (12, 3, 5, [4, 0, 3], [12, 10, 7], False, "sum", False, False),
    (12, 3, 5, [4, 1, 3], [12, 10, 7], True, "none", False, True),
    (4, 2, 5, [4, 3], [4, 2], True, "none", True, False),  # the second cannot align: inf, zeroed
    (6, 3, 5, [0, 0, 0], [6, 4, 5], True, "mean", False, False),  # only blanks: the recursion is 1 wide
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CTC)
def test_ctc_loss(dtype, case):
    T, N, C, tls, ils, two_d, reduction, zero_inf, as_tensors = case
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(T, N, C, dtype=dtype, generator=g).log_softmax(2).requires_grad_()
    targets = torch.randint(1, C, (N, max(max(tls), 2)) if two_d else (sum(tls),), generator=g)
    il, tl = (torch.tensor(ils), torch.tensor(tls)) if as_tensors else (ils, tls)
    fn = lambda lp: F.ctc_loss(lp, targets, il, tl, reduction=reduction, zero_infinity=zero_inf)  # noqa: E731
    want, got = _both(fn, lp)
    assert torch.equal(want[0], got[0])  # the loss is the kernel's recursion, op for op
    _close(want, got, *TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_randperm_out_draws_eagers_stream(dtype):
    want, got = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype)
    torch.manual_seed(7)
    torch.randperm(10, out=want)
    torch.manual_seed(7)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        torch.randperm(10, out=got)
    rec.assert_only("core_aten")
    assert torch.equal(want, got)


def test_index_put_impl_and_lift_fresh_copy():
    i, v = torch.tensor([1, 1, 3]), torch.tensor([1.0, 2.0, 3.0])
    want = torch.zeros(5)
    torch.ops.aten._index_put_impl_(want, [i], v, True)
    got = torch.zeros(5)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        out = torch.ops.aten._index_put_impl_(got, [i], v, True)
        copy = torch.ops.aten.lift_fresh_copy(got)
    rec.assert_only("core_aten")
    assert out is got and torch.equal(got, want)
    assert torch.equal(copy, got) and copy.data_ptr() != got.data_ptr()


HISTC = [  # (values, bins, min, max): data range, given range, NaN and edge values, a constant input, empty
    (torch.randn(1000, generator=torch.Generator().manual_seed(0)), 10, 0, 0),
    (torch.randn(1000, generator=torch.Generator().manual_seed(1)), 7, -1, 1),
    (torch.tensor([0.0, 1, 2, 3, float("nan"), 3]), 3, 0, 3),
    (torch.ones(5), 4, 0, 0),
    (torch.arange(64.0), 8, 0, 0),
    (torch.tensor([0.1, 0.2, 0.3, 0.7]), 10, 0, 1),
    (torch.empty(0), 5, 0, 0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", HISTC)
def test_histc_bins_as_the_kernel(dtype, case):
    x, bins, lo, hi = case
    x = x.to(dtype)
    want = torch.histc(x, bins, lo, hi)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = [torch.histc(x, bins, lo, hi) for _ in range(2)]
    rec.assert_only("core_aten")
    for g in got:
        assert g.dtype == want.dtype and torch.equal(g, want)


GROUPED = [  # (self shape, mat2 shape, offs)
    ((6, 8), (2, 8, 8), [2, 6]),
    ((6, 8), (2, 8, 8), [0, 6]),
    ((6, 8), (2, 8, 8), [2, 4]),  # rows past the last offset
    ((3, 4, 8), (3, 8, 8), None),
    ((8, 8), (8, 8), [3, 8]),
    ((2, 8, 8), (8, 16), [8, 16]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", GROUPED)
def test_grouped_mm(dtype, case):
    a_shape, b_shape, offs = case
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(a_shape, generator=g).to(dtype), torch.randn(b_shape, generator=g).to(dtype)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    want = torch._grouped_mm(a, b, offs=offs)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = torch._grouped_mm(a, b, offs=offs)
    rec.assert_only("core_aten")
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    if offs is not None and a.dim() == 2 and b.dim() == 3:  # the kernel leaves rows past the end unwritten
        want = want[: int(offs[-1])]
        assert torch.equal(got[int(offs[-1]) :], torch.zeros_like(got[int(offs[-1]) :]))
        got = got[: int(offs[-1])]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 0), (5, 2, 9), (3, 4, 4)])
def test_histc_integers_bin_as_cuda(dtype, bins, lo, hi):
    # the CPU has no integer kernel; CUDA's bins in integer arithmetic, which this reference spells out
    x = torch.randint(0, 12, (50,), generator=torch.Generator().manual_seed(0)).to(dtype)
    a, b = (int(x.min()), int(x.max())) if lo == hi else (lo, hi)  # min == max: the data range, as eager
    a, b = (a - 1, b + 1) if a == b else (a, b)
    want = torch.zeros(bins, dtype=dtype)
    for v in x.tolist():
        if a <= v <= b:
            want[min((v - a) * bins // (b - a), bins - 1)] += 1
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = torch.histc(x, bins, lo, hi)
    rec.assert_only("core_aten")
    assert got.dtype == dtype and torch.equal(got, want)


POOL_PAD = {  # name: (call, input shape)
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (3, 4)), (2, 3, 6, 8)),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 4)), (2, 2, 4, 6, 8)),
    "max_pool3d": (lambda x: F.max_pool3d(x, 3, 2, 1), (2, 2, 4, 6, 8)),
    "max_pool3d ceil_mode": (lambda x: F.max_pool3d(x, 2, 2, 0, ceil_mode=True), (2, 2, 5, 6, 7)),
    "replication_pad1d": (lambda x: F.pad(x, (2, 3), mode="replicate"), (2, 3, 5)),
    "replication_pad2d": (lambda x: F.pad(x, (2, 3, 1, 4), mode="replicate"), (2, 3, 6, 8)),
    "replication_pad2d negative": (lambda x: F.pad(x, (-1, 3, 1, -2), mode="replicate"), (2, 3, 6, 8)),
    "replication_pad3d": (lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode="replicate"), (2, 2, 4, 6, 8)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(POOL_PAD))
def test_pool_and_pad_backward(dtype, name):
    fn, shape = POOL_PAD[name]
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0), requires_grad=True)
    call = lambda x: fn(x)[0] if isinstance(fn(x), tuple) else fn(x)  # noqa: E731
    _close(*_both(call, x), *TOL[dtype])


def test_masked_scatter_backward():
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.5
    src = torch.randn(12, dtype=torch.float64, requires_grad=True)
    _close(*_both(lambda s: torch.zeros(3, 4, dtype=torch.float64).masked_scatter(mask, s), src), *TOL[torch.float64])


CUMULATIVE = [  # ties, NaNs (sticky, latest NaN's index), integers, bool, 0-dim, empty, bfloat16
    torch.randint(0, 4, (5, 9), generator=torch.Generator().manual_seed(0)).float(),
    torch.tensor([1.0, float("nan"), 0, 2, float("nan"), 5, 5]),
    torch.randint(0, 3, (3, 4, 6), generator=torch.Generator().manual_seed(1)),
    torch.tensor(3.0),
    torch.tensor([True, False, True, True, False]),
    torch.randn(2, 0, 3),
    torch.randint(0, 3, (17,), generator=torch.Generator().manual_seed(2)).to(torch.bfloat16),
]


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin], ids=["cummax", "cummin"])
@pytest.mark.parametrize("x", CUMULATIVE, ids=lambda x: f"{x.dtype}{list(x.shape)}")
def test_cummax_cummin_tie_break_as_the_kernel(op, x):
    for dim in range(max(x.dim(), 1)):
        want = op(x, dim)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = op(x, dim)
        rec.assert_only("core_aten")
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.stride() == g.stride() and torch.equal(w.nan_to_num(), g.nan_to_num())
            assert torch.equal(w.isnan(), g.isnan()) if w.is_floating_point() else True


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_distribution_and_seed(replacement):
    # another stream than the native kernel's: checked statistically, and reproducible under a seed
    p = torch.tensor([0.1, 0.0, 0.5, 0.4])
    rows, k = 20000, 3 if replacement else 2
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        torch.manual_seed(3)
        a = torch.multinomial(p.expand(rows, 4), k, replacement)
        torch.manual_seed(3)
        b = torch.multinomial(p.expand(rows, 4), k, replacement)
        c = torch.multinomial(p.expand(rows, 4), k, replacement)
    rec.assert_only("core_aten")
    assert a.dtype == torch.int64 and a.shape == (rows, k) and torch.equal(a, b) and not torch.equal(a, c)
    native = torch.multinomial(p.expand(rows, 4), k, replacement)
    for j in range(k):  # each draw's frequencies agree with the native kernel's (4 sigma)
        f_ours = torch.bincount(a[:, j], minlength=4) / rows
        f_native = torch.bincount(native[:, j], minlength=4) / rows
        assert f_ours[1] == 0 and torch.all((f_ours - f_native).abs() <= 4 * (2 * 0.25 / rows) ** 0.5)
    if not replacement:
        assert torch.all(a[:, 0] != a[:, 1])


@pytest.mark.parametrize("probs", [[0.5, -1.0], [0.0, 0.0], [1.0, float("nan")]])
def test_multinomial_refuses_what_eager_refuses(probs):
    p = torch.tensor(probs)
    with pytest.raises(RuntimeError) as want:
        torch.multinomial(p, 1)
    with ed.EagerDecompMode("core_aten"), pytest.raises(RuntimeError) as got:
        torch.multinomial(p, 1)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
@pytest.mark.parametrize("op", [torch.gcd, torch.lcm], ids=["gcd", "lcm"])
def test_gcd_lcm_exact(op, dtype):
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -100
    a, b = (torch.randint(lo, 100, (500,), generator=g).to(dtype) for _ in range(2))
    a[:3], b[1:4] = 0, 0
    if dtype == torch.int64:  # consecutive Fibonacci numbers: Euclid's longest runs
        a = torch.cat([a, torch.tensor([2**62, 7540113804746346429])])
        b = torch.cat([b, torch.tensor([3 * 2**40, 4660046610375530309])])
    want = op(a, b)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = op(a, b)
    rec.assert_only("core_aten")
    assert got.dtype == want.dtype and torch.equal(got, want)


POOL3D = [  # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (2, 2, 0, False, True, None),
    (3, 2, 1, False, True, None),
    (3, 2, 1, True, False, None),
    ((3, 2, 2), (1, 2, 3), (1, 0, 1), True, True, None),
    (2, 1, 1, False, False, 3),
    (3, None, 1, True, True, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", POOL3D)
def test_avg_pool3d_backward(dtype, channels_last, case):
    x = torch.randn(2, 3, 7, 6, 5, dtype=dtype, generator=torch.Generator().manual_seed(0))
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
    want, got = _both(lambda x: F.avg_pool3d(x, *case), x.requires_grad_())
    _close(want, got, *TOL[dtype])
    assert want[1].stride() == got[1].stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [(3, 2, 4), (7, 6, 5), (1, 1, 1), (5, 4, 3)])
def test_adaptive_avg_pool3d_backward(dtype, size):
    x = torch.randn(2, 3, 7, 6, 5, dtype=dtype, generator=torch.Generator().manual_seed(0), requires_grad=True)
    _close(*_both(lambda x: F.adaptive_avg_pool3d(x, size), x), *TOL[dtype])
    _close(*_both(lambda x: F.adaptive_avg_pool3d(x, size), x[0].detach().requires_grad_()), *TOL[dtype])
    want, got = _both(
        lambda x: F.adaptive_avg_pool3d(x, size), x.detach().to(memory_format=torch.channels_last_3d).requires_grad_()
    )
    _close(want, got, *TOL[dtype])
    assert want[1].stride() == got[1].stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_renorm(dtype, norm_type):
    w0 = torch.randn(10, 4, dtype=dtype, generator=torch.Generator().manual_seed(0)) * 3
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])  # a repeated row is scaled once
    w1, w2 = w0.clone(), w0.clone()
    o1 = F.embedding(idx, w1, max_norm=2.0, norm_type=norm_type)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        o2 = F.embedding(idx, w2, max_norm=2.0, norm_type=norm_type)
    rec.assert_only("core_aten")
    _close([w1, o1], [w2, o2], *TOL[dtype])


def _exact(want, got):
    for w, g in zip(want, got):
        assert (w.dtype, w.shape, w.stride()) == (g.dtype, g.shape, g.stride())
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("size", [(3, 4), (5, 2), (7, 9), (1, 1), (6, 8), (4, 3)])
def test_adaptive_max_pool2d(dtype, size):
    # ties (small integers), two NaNs in one window (the last wins), an all -inf plane
    x = torch.randint(-3, 3, (2, 3, 7, 9), generator=torch.Generator().manual_seed(0)).to(dtype)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")
    x[1, 1] = -float("inf")
    for t in (x, x[0], x.to(memory_format=torch.channels_last)):
        want = F.adaptive_max_pool2d(t, size, return_indices=True)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = F.adaptive_max_pool2d(t, size, return_indices=True)
        rec.assert_only("core_aten")
        _exact(want, got)


@pytest.mark.parametrize("size", [(2, 3, 4), (5, 7, 6), (3, 2, 5), (1, 1, 1)])
def test_adaptive_max_pool3d(size):
    y = torch.randint(-3, 3, (2, 2, 5, 7, 6), generator=torch.Generator().manual_seed(0)).float()
    y[0, 0, 0, 0, :3] = float("nan")
    for t in (y, y[0], y.to(memory_format=torch.channels_last_3d)):
        want = F.adaptive_max_pool3d(t, size, return_indices=True)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = F.adaptive_max_pool3d(t, size, return_indices=True)
        rec.assert_only("core_aten")
        _exact(want, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses(dtype, reduction):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, dtype=dtype, generator=g, requires_grad=True)
    y, w = torch.randint(0, 4, (5,), generator=g), torch.rand(4, dtype=dtype, generator=g)
    for p in (1, 2):
        _close(*_both(lambda t: F.multi_margin_loss(t, y, p=p, margin=0.7, reduction=reduction), x), *TOL[dtype])
        _close(*_both(lambda t: F.multi_margin_loss(t, y, p=p, weight=w, reduction=reduction), x), *TOL[dtype])
    # slots after the first -1 are ignored (PyTorch's forward decomposition summed them); a
    # class named twice counts twice
    yt = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [1, -1, 2, 2], [-1, 0, 0, 0], [2, 2, -1, 0]])
    _close(*_both(lambda t: F.multilabel_margin_loss(t, yt, reduction=reduction), x), *TOL[dtype])
    if reduction != "none":  # 1-D with 'none': the meta kernel says [1], the CPU kernel [] (not ours)
        x1 = x[0].detach().requires_grad_()
        _close(*_both(lambda t: F.multi_margin_loss(t, y[0], reduction=reduction), x1), *TOL[dtype])
        _close(*_both(lambda t: F.multilabel_margin_loss(t, yt[0], reduction=reduction), x1), *TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_distance_backwards(dtype, p):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 5, 3, dtype=dtype, generator=g), torch.randn(2, 4, 3, dtype=dtype, generator=g)
    b[0, 0] = a[0, 0]  # a zero distance
    a[1, 1, 0] = b[1, 1, 0]  # a zero difference
    tol = TOL[dtype]
    _close(*_both(lambda x, y: torch.cdist(x, y, p=p), a.requires_grad_(), b.requires_grad_()), *tol)
    _close(
        *_both(lambda x, y: torch.cdist(x, y, p=p), a[0].detach().requires_grad_(), b[0].detach().requires_grad_()),
        *tol,
    )
    # broadcast batch dims: the kernel's gradient has the broadcast shape, autograd sums it
    _close(
        *_both(
            lambda x, y: torch.cdist(x, y, p=p), a[:1].detach().requires_grad_(), b[:, None].detach().requires_grad_()
        ),
        *tol,
    )
    _close(*_both(lambda x: F.pdist(x, p=p), a[0].detach().requires_grad_()), *tol)


def test_multilabel_margin_loss_1d_unreduced_is_declined_not_reshaped():
    """Eager's CPU kernel gives a 0-dim loss here, its meta kernel a [1] one: a clear error,
    never the meta kernel's shape."""
    x, t = torch.randn(5), torch.tensor([1, -1, 0, 0, 0])
    assert F.multilabel_margin_loss(x, t, reduction="none").shape == ()
    with pytest.raises(ed.UnsupportedOpError, match="multilabel_margin_loss_forward"):
        with ed.EagerDecompMode("core_aten"):
            F.multilabel_margin_loss(x, t, reduction="none")
    with ed.EagerDecompMode("core_aten"):  # reduced, and 2-d unreduced, still decompose
        got = [F.multilabel_margin_loss(x, t), F.multilabel_margin_loss(x[None], t[None], reduction="none")]
    want = [F.multilabel_margin_loss(x, t), F.multilabel_margin_loss(x[None], t[None], reduction="none")]
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w)


def test_multi_margin_loss_0d_target_unreduced_is_declined_not_reshaped():
    """A 1-d input with a 0-dim target: eager's loss is 0-dim, the meta kernel's and PyTorch's
    decomposition's [1]. A clear error, never the wrong shape; the other forms still decompose."""
    x = torch.randn(5)
    assert F.multi_margin_loss(x, torch.tensor(2), reduction="none").shape == ()
    with pytest.raises(ed.UnsupportedOpError, match="multi_margin_loss"):
        with ed.EagerDecompMode("core_aten"):
            F.multi_margin_loss(x, torch.tensor(2), reduction="none")
    calls = [
        lambda: F.multi_margin_loss(x, torch.tensor([2]), reduction="none"),
        lambda: F.multi_margin_loss(x, torch.tensor(2)),
        lambda: F.multi_margin_loss(x[None].repeat(3, 1), torch.tensor([0, 2, 4]), reduction="none"),
    ]
    with ed.EagerDecompMode("core_aten"):
        got = [c() for c in calls]
    for g, c in zip(got, calls):
        w = c()
        assert g.shape == w.shape and torch.allclose(g, w)


def test_is_all_true_and_is_any_true():
    for data in ([True, True], [True, False], [False, False], []):
        x = torch.tensor(data, dtype=torch.bool)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = (torch._is_all_true(x), torch._is_any_true(x))
        rec.assert_only("core_aten")
        for g, w in zip(got, (torch._is_all_true(x), torch._is_any_true(x))):
            assert (g.dtype, g.shape, g.item()) == (w.dtype, w.shape, w.item())


def test_assert_async_raises_eagers_errors():
    for x in (torch.tensor(0.0), torch.tensor([1, 2]), torch.tensor([]), torch.tensor(float("nan")), torch.tensor(3)):
        for args in ((), ("boom",)):
            try:
                torch._assert_async(x, *args)
                native = None
            except RuntimeError as e:
                native = str(e)
            with ed.EagerDecompMode("core_aten"):
                if native is None:
                    torch._assert_async(x, *args)
                else:
                    with pytest.raises(RuntimeError) as ours:
                        torch._assert_async(x, *args)
                    assert str(ours.value) == native


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addbmm_is_bitwise_eager(dtype, beta, alpha):
    # eager adds one batch at a time (an addmm each); a bmm summed over the batch rounded
    # otherwise (past float32's tolerance on some CPUs)
    g = torch.Generator().manual_seed(0)
    for batches, n, m, p in ((5, 3, 7, 4), (1, 2, 2, 2), (0, 3, 2, 4), (9, 8, 16, 5)):
        s = (torch.randn(n, p, generator=g) * 4).to(dtype)
        b1, b2 = ((torch.randn(*shape, generator=g) * 4).to(dtype) for shape in ((batches, n, m), (batches, m, p)))
        if batches == 0 and not dtype.is_floating_point and type(beta) is float:
            # eager scales self in place by beta when there is no batch: refused on integers
            for mode in (contextlib.nullcontext(), ed.EagerDecompMode("core_aten")):
                with pytest.raises(RuntimeError, match="can't be cast"), mode:
                    torch.addbmm(s[:1], b1, b2, beta=beta, alpha=alpha)
            continue
        want = torch.addbmm(s[:1], b1, b2, beta=beta, alpha=alpha)  # a broadcast self, too
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = torch.addbmm(s[:1], b1, b2, beta=beta, alpha=alpha)
        rec.assert_only("core_aten")
        assert got.dtype == want.dtype and got.stride() == want.stride() and torch.equal(got, want)
