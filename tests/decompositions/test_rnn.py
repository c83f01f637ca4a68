"""The fused LSTM/GRU cells (eagerdecomp/rnn.py): nn.LSTM and nn.GRU train on a device with the
switch as on CPU, and the cells under the mode follow the CUDA kernels' arithmetic."""

import copy

import pytest
import torch
import torch.nn as nn

import eagerdecomp as ed
from eagerdecomp.errors import BackendError
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten


@pytest.fixture(scope="module")
def dev():
    refdev = pytest.importorskip("eagerdecomp.device.refdev")
    try:
        return refdev.reference_device()
    except BackendError as e:
        pytest.skip(f"reference device unavailable: {e}")


def _train(model, x, *extra):
    out = model(x, *extra)
    y, state = out if isinstance(out, tuple) else (out, None)
    if isinstance(y, nn.utils.rnn.PackedSequence):
        y = nn.utils.rnn.pad_packed_sequence(y, batch_first=True)[0]
    loss = y.square().sum() + (sum(s.sum() for s in state) if isinstance(state, tuple) else 0)
    loss.backward()
    return y.detach(), [p.grad for p in model.parameters()], getattr(x, "grad", None)


RECURRENT = {
    "lstm 2 layers bidirectional": lambda: nn.LSTM(5, 6, num_layers=2, bidirectional=True, batch_first=True),
    "lstm no bias, projections": lambda: nn.LSTM(5, 6, bias=False, proj_size=3),
    "gru 2 layers": lambda: nn.GRU(5, 6, num_layers=2, batch_first=True),
    "gru no bias bidirectional": lambda: nn.GRU(5, 6, bias=False, bidirectional=True),
    "lstm cell": lambda: nn.LSTMCell(5, 6),
    "gru cell": lambda: nn.GRUCell(5, 6),
}


@pytest.mark.parametrize("name", list(RECURRENT))
def test_recurrent_layers_train_on_the_device_as_on_cpu(name, dev):
    torch.manual_seed(0)
    model = RECURRENT[name]()
    x = torch.randn(3, 4, 5) if "cell" not in name else torch.randn(4, 5)
    ours = copy.deepcopy(model).to(dev)
    want = _train(model, x.clone().requires_grad_())
    mode = ed.enable(dev)
    try:
        got = _train(ours, x.to(dev).requires_grad_())
        report = mode.report()
    finally:
        ed.disable(dev)
    torch.testing.assert_close(got[0].cpu(), want[0])
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g.cpu(), w)
    torch.testing.assert_close(got[2].cpu(), want[2])
    cell = "lstm" if "lstm" in name else "gru"
    assert report.row(getattr(aten, f"_thnn_fused_{cell}_cell").default).calls > 0


def test_packed_sequences_on_the_device(dev):
    torch.manual_seed(0)
    model = nn.GRU(4, 5, batch_first=True)
    x, lengths = torch.randn(3, 6, 4), torch.tensor([6, 4, 2])  # lengths stay on the CPU, as PyTorch asks
    ours = copy.deepcopy(model).to(dev)
    want = _train(model, nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True))
    ed.enable(dev)
    try:
        got = _train(ours, nn.utils.rnn.pack_padded_sequence(x.to(dev), lengths, batch_first=True))
    finally:
        ed.disable(dev)
    torch.testing.assert_close(got[0].cpu(), want[0])
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g.cpu(), w)


# -- the cells themselves, under the mode on CPU (where eager has no kernel for them) -----------


def _sig(t):
    return 1 / (1 + torch.exp(-t))


def _lstm_reference(ig, hg, cx, bi, bh):
    gates = ig + hg + (bi + bh if bi is not None else 0)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = _sig(i), _sig(f), torch.tanh(g), _sig(o)
    cy = f * cx + i * g
    return o * torch.tanh(cy), cy, torch.cat([i, f, g, o], 1)


def _gru_reference(ig, hg, hx, bi, bh):
    ir, ii, in_ = (ig + (bi if bi is not None else 0)).chunk(3, 1)
    hr, hi, hn = (hg + (bh if bh is not None else 0)).chunk(3, 1)
    r, z = _sig(ir + hr), _sig(ii + hi)
    n = torch.tanh(in_ + r * hn)
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _inputs(n_gates, dtype, bias, strided):
    g = torch.Generator().manual_seed(1)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    ig, hg, h = make(4, n_gates * 6), make(4, n_gates * 6), make(4, 6)
    if strided:  # gate projections that are views of a wider matmul
        ig = make(4, n_gates * 12)[:, ::2]
    bi, bh = (make(n_gates * 6), make(n_gates * 6)) if bias else (None, None)
    return [t.to(dtype) if t is not None else None for t in (ig, hg, h, bi, bh)]


CELL_CASES = [
    (dtype, bias, strided)
    for dtype in (torch.float32, torch.float64, torch.float16)
    for bias in (True, False)
    for strided in (False, True)
]


@pytest.mark.parametrize("dtype,bias,strided", CELL_CASES)
def test_fused_cells_under_the_mode(dtype, bias, strided):
    # against a float64 reference: float32's own tolerance, half's as the kernel rounds its results
    tol = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.float32: dict(atol=1e-5, rtol=1.3e-6)}.get(dtype, {})
    for op, reference, n in (
        (aten._thnn_fused_lstm_cell.default, _lstm_reference, 4),
        (aten._thnn_fused_gru_cell.default, _gru_reference, 3),
    ):
        args = _inputs(n, dtype, bias, strided)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = op(*args)
        rec.assert_only("core_aten")
        want = reference(*[a.double() if a is not None else None for a in args])
        for g, w in zip(got, want):
            assert g.dtype == dtype and g.shape == w.shape and g.is_contiguous()
            torch.testing.assert_close(g.double(), w, **tol, check_dtype=False)


def test_fused_cell_backwards_under_the_mode():
    # against autograd through the reference formulas, in float64; a missing LSTM gradient is zero
    for bias in (True, False):
        ig, hg, c, bi, bh = _inputs(4, torch.float64, bias, False)
        leaves = [t.requires_grad_() for t in (ig, hg, c, bi, bh) if t is not None]
        hy, cy, ws = _lstm_reference(ig, hg, c, bi, bh)
        g_hy, g_cy = torch.randn_like(hy), torch.randn_like(cy)
        for gh, gc in ((g_hy, g_cy), (g_hy, None), (None, g_cy)):
            want = torch.autograd.grad(
                [t for t, g in ((hy, gh), (cy, gc)) if g is not None],
                leaves,
                [g for g in (gh, gc) if g is not None],
                retain_graph=True,
            )
            with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
                gates, gcx, gbias = aten._thnn_fused_lstm_cell_backward_impl(
                    gh, gc, c.detach(), cy.detach(), ws.detach(), bias
                )
            rec.assert_only("core_aten")
            torch.testing.assert_close(gates, want[0])
            torch.testing.assert_close(gates, want[1])  # input and hidden projections get the same gradient
            torch.testing.assert_close(gcx, want[2])
            if bias:
                torch.testing.assert_close(gbias, want[3])
            else:
                assert gbias is None
        with ed.EagerDecompMode("core_aten"):
            assert aten._thnn_fused_lstm_cell_backward_impl(None, None, c, cy, ws, bias) == (None, None, None)

        ig, hg, h, bi, bh = _inputs(3, torch.float64, bias, False)
        leaves = [t.requires_grad_() for t in (ig, hg, h, bi, bh) if t is not None]
        hy, ws = _gru_reference(ig, hg, h, bi, bh)
        g_hy = torch.randn_like(hy)
        want = torch.autograd.grad(hy, leaves, g_hy)
        with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
            got = aten._thnn_fused_gru_cell_backward(g_hy, ws.detach(), bias)
        rec.assert_only("core_aten")
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        assert (got[3] is None and got[4] is None) != bias
