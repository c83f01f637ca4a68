"""One name for a test on every device: ``test_nn.py::TestNNDeviceType::test_x_DEVICE_float32``.

PyTorch's ``instantiate_device_type_tests`` copies each test per device, suffixing the
class (``TestNNDeviceTypeCPU``; a PrivateUse1 copy is ``...PRIVATEUSE1`` or the backend's
name in capitals) and inserting the device type after the test's name (``test_x_cpu``,
then dtype and parameter suffixes).
"""

from __future__ import annotations

import re


def generic_id(file: str, cls: str, name: str, device: str) -> str:
    """The generic id of the ``device`` copy (``"cpu"`` or the backend's name) of a test."""
    for suffix in ("CPU", "PRIVATEUSE1", device.upper()):
        if cls.endswith(suffix):
            cls = cls[: -len(suffix)]
            break
    matches = list(re.finditer(rf"_(?:cpu|{re.escape(device)})(?=_|$)", name))
    last = matches[-1] if matches else None
    if last is not None:  # the device comes right after the test's own name: the last match
        name = name[: last.start()] + "_DEVICE" + name[last.end() :]
    return f"{file}::{cls}::{name}"
