"""Tests of PyTorch's device suites expected to fail on a reference device, each with its reason.

A reason is an op with no path to the device's kernels, a device feature the reference
devices do not offer, or a test that assumes its device is CPU or CUDA; never a wrong result.
Entries are generic test ids (the device written ``DEVICE``); ``*`` matches any run of
characters, for a test's parametrized copies. :data:`_BY_REASON` holds for both reference
devices (``edref``, ``edprims``); :data:`_BY_DEVICE` adds what one of them alone expects.
"""

from __future__ import annotations

import fnmatch
import functools

_BY_REASON: dict[str, str] = {
    "no path: the fused optimizer kernels (_fused_adam_, _fused_adamw_, _fused_sgd_) have no decomposition": """
        test_torch.py::TestTorchDeviceType::test_grad_scaling_autocast_foreach2_fused_True_*_DEVICE_float32
    """,
    "device feature: quantized tensors (the reference devices have no quantized backend)": """
        test_view_ops.py::TestOldViewOps::test_flatten_DEVICE
        test_view_ops.py::TestOldViewOps::test_ravel_DEVICE
    """,
    "device feature: sparse tensors (the reference devices have no sparse backend)": """
        test_torch.py::TestTorchDeviceType::test_grad_scaling_unscale_sparse_DEVICE_float32
        test_torch.py::TestTorchDeviceType::test_memory_format_empty_like_DEVICE
    """,
    "device feature: nested tensors (the reference devices have no NestedTensor backend)": """
        test_nn.py::TestNNDeviceType::test_TransformerEncoderLayer_empty_DEVICE
    """,
    "the test assumes CPU or CUDA: it expects CPU's storage classes (torch.FloatStorage) on any other device; "
    "edref's are its own (torch.edref.FloatStorage), as CUDA's are": """
        test_torch.py::TestTorchDeviceType::test_tensor_storage_type_DEVICE_*
    """,
    "the test assumes CPU or CUDA: it builds torch.cpu.amp.GradScaler on any other device and expects the "
    "device's own name in its deprecation warning": """
        test_torch.py::TestTorchDeviceType::test_grad_scaler_deprecated_warning_DEVICE
    """,
    "the test assumes CPU or CUDA: it expects a CPU torch.FloatTensor as the scale on any other device": """
        test_torch.py::TestTorchDeviceType::test_grad_scaling_state_dict_DEVICE
    """,
    "the test assumes CPU or CUDA: it expects uint8 bilinear and bicubic resizing refused on every device but "
    "CPU (CUDA has no uint8 kernel); edref resizes uint8 as CPU does, bit for bit": """
        test_nn.py::TestNNDeviceType::test_upsamplingBiMode2d_nonsupported_dtypes_*_mode_bi*_uint8_DEVICE_uint8
    """,
    "the test assumes CPU: map_ and map2_ run a Python callback per element, CPU tensors only (CUDA refuses too)": """
        test_torch.py::TestTorchDeviceType::test_broadcast_fn_map_DEVICE
        test_torch.py::TestTorchDeviceType::test_broadcast_fn_map2_DEVICE
    """,
}


# device -> its own expected failures beyond _BY_REASON
_BY_DEVICE: dict[str, dict[str, str]] = {
    "edref": {},
    # NOTE: from the runs on edprims (docs/device-guide.md); the dtype copies of a listed test are
    # listed with it
    "edprims": {},
}


@functools.cache
def _patterns(device: str) -> tuple:
    tables = (_BY_REASON, _BY_DEVICE[device])
    return tuple((p, reason) for table in tables for reason, ids in table.items() for p in ids.split())


def reason_for(test_id: str, device: str = "edref") -> str | None:
    """Why ``test_id`` is expected to fail on ``device`` (a reference device), or None."""
    for pattern, reason in _patterns(device):
        if fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


def unused(test_ids, device: str = "edref") -> list:
    """Patterns that match none of ``test_ids`` (stale entries, in a run of every test)."""
    ids = list(test_ids)
    return [p for p, _ in _patterns(device) if not any(fnmatch.fnmatchcase(t, p) for t in ids)]
