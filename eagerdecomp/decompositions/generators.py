"""Explicit generators: a draw from ``generator=`` made by the opset's own random op.

Core ATen keeps ``rand``, ``randn`` and ``randperm`` without a generator argument: they draw
from the device's default generator. A call with ``generator=g`` (a DataLoader's
``RandomSampler`` shuffles with ``randperm(n, generator=g)``) is made the same op's way here:
``g``'s state is lent to the default generator for that one draw, the advanced state is given
back to ``g``, and the default generator gets its own state back. The numbers are the core op's
draw from ``g``'s state, so they are eager's, and both generators end where eager leaves them.

Only state moves (``Generator.get_state``/``set_state``, which dispatch no op): the values come
from the opset op. Calls with a generator are never keyed (the runtime decomposes them on the
real tensors on every call), so no kernel bakes a generator in.

NOTE: lending is atomic with respect to other lendings (a lock), not with respect to another
thread drawing from the default generator at the same moment: such a thread would draw from
``g``'s state (docs/limits.md).
"""

from __future__ import annotations

import contextlib
import threading

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.variants import resize_out

__all__ = ["drawing_from", "lendable"]

aten = torch.ops.aten

_lock = threading.RLock()  # one lending at a time (a lent draw may lend again: reentrant)


def _default_for(device: torch.device):
    """The default generator of ``device``'s type, or None where torch names none."""
    if device.type == "cpu":
        return torch.default_generator
    module = getattr(torch, device.type, None)
    defaults = getattr(module, "default_generators", None)
    if not defaults:
        return None
    return defaults[device.index if device.index is not None else 0]


def lendable(generator, device=None) -> bool:
    """True when ``generator``'s state can be lent for a draw on ``device`` (its own by default)."""
    if generator is None:
        return True
    if not isinstance(generator, torch.Generator):
        return False
    device = torch.device(device) if device is not None else generator.device
    return device.type == generator.device.type and _default_for(generator.device) is not None


@contextlib.contextmanager
def drawing_from(generator):
    """Within the block, the default generator of ``generator``'s device draws ``generator``'s
    stream; after it, ``generator`` holds the advanced state and the default generator its own.
    ``None``: the default generator itself (nothing is lent)."""
    if generator is None:
        yield
        return
    default = _default_for(generator.device)
    if default is None or default is generator:
        yield
        return
    with _lock:
        saved = default.get_state()
        default.set_state(generator.get_state())
        try:
            yield
            generator.set_state(default.get_state())
        finally:
            default.set_state(saved)


def _declines(generator, device) -> bool:
    return not lendable(generator, device if device is not None else "cpu")


@project_decomposition(aten.rand.generator)
def rand_generator(size, *, generator, dtype=None, layout=None, device=None, pin_memory=None):
    if _declines(generator, device):
        return NotImplemented
    with drawing_from(generator):
        return aten.rand.default(size, dtype=dtype, device=device)


@project_decomposition(aten.randn.generator)
def randn_generator(size, *, generator, dtype=None, layout=None, device=None, pin_memory=None):
    if _declines(generator, device):
        return NotImplemented
    with drawing_from(generator):
        return aten.randn.default(size, dtype=dtype, device=device)


@project_decomposition(aten.randperm.generator)
def randperm_generator(n, *, generator, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    if _declines(generator, device):
        return NotImplemented
    with drawing_from(generator):
        return aten.randperm.default(n, dtype=dtype, device=device)


@project_decomposition(aten.randperm.generator_out)
def randperm_generator_out(n, *, generator, out):
    # NOTE: as randperm.out (rng.py): the core randperm in out's dtype draws what the out= kernel does
    if _declines(generator, out.device):
        return NotImplemented
    with drawing_from(generator):
        result = aten.randperm.default(n, dtype=out.dtype, device=out.device)
    resize_out(out, result.shape)
    return aten.copy_.default(out, result)
