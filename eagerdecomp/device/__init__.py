"""The device side: the switch that sends a device's missing ops through eagerdecomp
(:mod:`~eagerdecomp.device.switch`), the reference device ``edref``
(:mod:`~eagerdecomp.device.refdev`), its process group (:mod:`~eagerdecomp.device.refdev_dist`)
and Inductor's CPU checks answered for it (:mod:`~eagerdecomp.device.inductor`)."""

from eagerdecomp.device.switch import (
    DISPATCH_KEYS,
    DeviceSwitch,
    device_opset,
    disable,
    enable,
    enable_from_env,
    enabled,
)

__all__ = ["enable", "disable", "enabled", "device_opset", "enable_from_env", "DISPATCH_KEYS", "DeviceSwitch"]
