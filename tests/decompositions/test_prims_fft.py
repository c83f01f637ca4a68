"""The FFTs under ``prims_fusion`` (decompositions/fft.py ``PRIMS_FFT``): core ATen's real
transforms lower to the FFT prims and a scale, the complex one through them.

Each call is compared with native eager under ``EagerDecompMode("prims_fusion")`` (dtype, shape,
strides; values to the dtype's tolerance: eager scales inside its transform, the prims after
it), the witness checking that only the preset's ops reached the kernels. Unnormalized
transforms are compared exactly: the prim's ATen form is eager's own transform. The conjugating
transforms (``hfft``, ``ihfft``) and the gradients stop at ``_conj`` and ``view_as_real`` here
as under core ATen (docs/exactness.md). Each call runs in both tiers (direct, and traced then
replayed): a traced kernel reads the prims' results through their meta's strides.
"""

import pytest
import torch

from tests.compare import check_against_eager

PRESET = "prims_fusion"


@pytest.fixture(autouse=True, params=["direct", "traced"])
def tier(request, monkeypatch):
    monkeypatch.setenv("EAGERDECOMP_TRACE_AFTER", "2" if request.param == "direct" else "0")


torch.manual_seed(0)
R = torch.randn(4, 6, 10)
Z = torch.randn(4, 6, 10, dtype=torch.complex64)

NORMALIZED = {
    "rfft-ortho": lambda: torch.fft.rfft(R, norm="ortho"),
    "rfft-forward": lambda: torch.fft.rfft(R, norm="forward"),
    "irfft": lambda: torch.fft.irfft(Z),
    "irfft-odd-n": lambda: torch.fft.irfft(Z, n=9, norm="ortho"),
    "rfft2": lambda: torch.fft.rfft2(R),
    "irfftn": lambda: torch.fft.irfftn(Z, s=(5, 8), dim=(0, 2)),
    "fft-complex": lambda: torch.fft.fft(Z, dim=1),
    "ifft2-complex": lambda: torch.fft.ifft2(Z),
    "fftn-real": lambda: torch.fft.fftn(R, norm="ortho"),
    "rfft-float64": lambda: torch.fft.rfft(R.double(), dim=0, norm="forward"),
    "rfft-strided": lambda: torch.fft.rfft(R.transpose(0, 2)[::2]),
    "ifft-leading-dims-out": lambda: torch.fft.ifft2(R, dim=(0, -1), out=torch.empty(0, dtype=torch.complex64)),
    "stft": lambda: torch.stft(R[0].flatten(), 8, hop_length=4, window=torch.hann_window(8), return_complex=True),
}


@pytest.mark.parametrize("name", list(NORMALIZED))
def test_normalized_transforms_match_eager(name):
    check_against_eager(NORMALIZED[name], opset=PRESET, exact=False)


UNNORMALIZED = {
    "rfft": lambda: torch.fft.rfft(R),
    "rfft2-strided": lambda: torch.fft.rfft2(R[:, ::2]),
    "rfft-leading-dim": lambda: torch.fft.rfft(R, dim=0),
    "irfft-backward": lambda: torch.fft.irfft(Z, norm="forward"),
}


@pytest.mark.parametrize("name", list(UNNORMALIZED))
def test_unnormalized_transforms_are_eagers(name):
    check_against_eager(UNNORMALIZED[name], opset=PRESET)
