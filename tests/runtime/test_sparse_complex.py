"""Sparse gradients and complex conjugation: the clear error under the preset, and the way through
a backend with those features has (docs/limits.md says why the presets keep the error).

* A sparse embedding's gradient is a sparse COO tensor; no preset has sparse kernels, and a device
  without them cannot run it either (PyTorch's own error on edref). Dense gradients are the way.
* A complex FFT filter runs under ``core_aten`` until a conjugate is taken (``.conj()``, every
  complex gradient): ``_conj`` is a conjugate *view* (a bit on the tensor, materialized through
  ``view_as_real``), which core ATen cannot express. A backend with complex dtypes adds the three
  complex view ops to its opset, and the filter then runs exactly as native.
"""

import copy

import pytest
import torch
import torch.nn as nn

import eagerdecomp as ed
from eagerdecomp.testing import RecordingMode

aten = torch.ops.aten
COMPLEX_VIEWS = ["aten::_conj", "aten::view_as_real", "aten::view_as_complex"]
WITH_COMPLEX = ed.OpSet.preset("core_aten") | COMPLEX_VIEWS


def _fft_filter(x, h, conj=True):
    """A frequency-domain filter: rfft, a complex product, irfft; and the input's gradient."""
    x = x.detach().clone().requires_grad_()
    spectrum = torch.fft.rfft(x)
    y = torch.fft.irfft(spectrum * (h.conj() if conj else h), n=x.shape[-1])
    y.square().sum().backward()
    return [y.detach(), x.grad]


def _sparse_step(emb, opt_cls, idx):
    opt = opt_cls(emb.parameters(), lr=0.1)
    emb(idx).square().sum().backward()
    opt.step()
    return emb.weight.detach()


def _data():
    torch.manual_seed(0)
    return torch.randn(4, 64), torch.randn(33, dtype=torch.complex64)


def test_fft_filter_without_gradients_runs_under_core_aten():
    x, h = _data()
    want = torch.fft.irfft(torch.fft.rfft(x) * h, n=64)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = torch.fft.irfft(torch.fft.rfft(x) * h, n=64)
    rec.assert_only("core_aten")
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("conj", [True, False], ids=["conj", "gradient only"])
def test_conjugation_has_no_path_in_core_aten(conj):
    x, h = _data()
    with pytest.raises(ed.UnsupportedOpError, match=r"aten\._conj\.default has no path"):
        with ed.EagerDecompMode("core_aten"):
            _fft_filter(x, h, conj)


@pytest.mark.parametrize("conj", [True, False], ids=["conj", "gradient only"])
def test_fft_filter_with_the_complex_views_in_the_opset_matches_native(conj):
    x, h = _data()
    want = _fft_filter(x, h, conj)
    with RecordingMode() as rec, ed.EagerDecompMode(WITH_COMPLEX):
        got = _fft_filter(x, h, conj)
    rec.assert_only(WITH_COMPLEX)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        torch.testing.assert_close(g, w)


def test_conjugate_view_keeps_aliasing_with_the_complex_views():
    h = torch.randn(5, dtype=torch.complex64)
    with ed.EagerDecompMode(WITH_COMPLEX):
        c = h.conj()
        assert c.is_conj() and c._base is h
        real = torch.view_as_real(c.resolve_conj())
    torch.testing.assert_close(real, torch.view_as_real(h.conj().resolve_conj()))


def test_fft_filter_on_the_device(switched_device):
    # edref has the complex views (DEVICE_RUNTIME_OPS): the filter and its gradient run there
    x, h = _data()
    want = _fft_filter(x, h)
    got = _fft_filter(x.to(switched_device), h.to(switched_device))
    for g, w in zip(got, want):
        assert g.device == switched_device
        torch.testing.assert_close(g.cpu(), w)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.SparseAdam])
def test_sparse_embedding_gradients_raise_a_clear_error(opt_cls):
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4, sparse=True)
    with pytest.raises(ed.UnsupportedOpError, match=r"aten\._sparse_coo_tensor_with_dims_and_tensors\.default"):
        with ed.EagerDecompMode("core_aten"):
            _sparse_step(emb, opt_cls, torch.tensor([[1, 2, 4], [4, 3, 9]]))


def test_dense_embedding_gradients_give_sgds_sparse_update():
    # the remedy docs/limits.md names: sparse=False, with SGD the same weights as the sparse step
    torch.manual_seed(0)
    sparse = nn.Embedding(10, 4, sparse=True)
    dense = copy.deepcopy(sparse)
    dense.sparse = False
    idx = torch.tensor([[1, 2, 4], [4, 3, 9]])
    want = _sparse_step(sparse, torch.optim.SGD, idx)
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = _sparse_step(dense, torch.optim.SGD, idx)
    rec.assert_only("core_aten")
    torch.testing.assert_close(got, want)


def test_sparse_embedding_on_a_device_without_sparse_kernels_fails_as_pytorch_says(switched_device):
    emb = nn.Embedding(10, 4, sparse=True).to(switched_device)
    with pytest.raises(NotImplementedError, match=r"with arguments from the 'Sparseedref' backend"):
        _sparse_step(emb, torch.optim.SGD, torch.tensor([[1, 2]], device=switched_device))


@pytest.mark.parametrize(
    "name,fn,op",
    [
        ("detach", lambda s: s.detach(), "aten.detach.default"),
        ("in-place mul", lambda s: s.clone().mul_(2), "aten.mul_.Tensor"),
        ("zeros_like", lambda s: torch.zeros_like(s), "aten.zeros_like.default"),
    ],
)
def test_a_decomposition_that_cannot_run_on_a_sparse_tensor_names_the_op_and_layout(name, fn, op):
    sparse = torch.randn(3, 3).relu().to_sparse()
    fn(sparse)  # eager runs it
    with pytest.raises(ed.UnsupportedArgumentError, match=rf"{op}: .*torch\.sparse_coo"):
        with ed.EagerDecompMode("core_aten"):
            fn(sparse)


def test_ops_in_the_opset_pass_sparse_tensors_through():
    sparse = torch.randn(3, 3).relu().to_sparse()
    with RecordingMode() as rec, ed.EagerDecompMode("core_aten"):
        got = [sparse + sparse, sparse.t()]
    rec.assert_only("core_aten")
    for g, want in zip(got, [sparse + sparse, sparse.t()]):
        assert g.layout == torch.sparse_coo and torch.equal(g.to_dense(), want.to_dense())
