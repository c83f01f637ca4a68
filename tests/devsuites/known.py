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
    # NOTE: from the runs so far on edprims: test_view_ops.py whole, every 4th test of test_torch.py
    # and test_nn.py (docs/device-guide.md); the dtype copies of a listed test are listed with it
    "edprims": {
        "no path: index_reduce has no decomposition to the prims_fusion preset (core ATen keeps it)": """
            test_torch.py::TestTorchDeviceType::test_index_reduce_reduce_*_DEVICE_float32
            test_torch.py::TestTorchDeviceType::test_index_reduce_reduce_*_DEVICE_float64
            test_torch.py::TestTorchDeviceType::test_index_reduce_reduce_*_DEVICE_int*
            test_torch.py::TestTorchDeviceType::test_index_reduce_reduce_*_DEVICE_uint8
        """,
        "no path: masked_scatter_ has no decomposition to the prims_fusion preset": """
            test_torch.py::TestTorchDeviceType::test_masked_scatter_DEVICE_*
        """,
        "no path: masked_select's out= form has no decomposition to the prims_fusion preset": """
            test_torch.py::TestTorchDeviceType::test_masked_select_DEVICE_*
        """,
        "no path: scatter's reduce= forms (and scatter_reduce.two) have no decomposition to prims_fusion": """
            test_torch.py::TestTorchDeviceType::test_scatter_reduce_non_unique_index_DEVICE_float32
            test_torch.py::TestTorchDeviceType::test_scatter_reduce_operations_to_large_input_DEVICE_float32
            test_torch.py::TestTorchDeviceType::test_scatter_reduce_scalar_DEVICE_float32
            test_nn.py::TestNNDeviceType::test_MarginLoss_empty_DEVICE_float32
        """,
        "no path: an in-place write into an expanded tensor (eager allows threshold_ there: idempotent) is "
        "written through scatter_reduce, which has no decomposition to the prims_fusion preset": """
            test_nn.py::TestNNDeviceType::test_threshold_inplace_overlap_DEVICE
        """,
    },
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
