"""The cache key: everything that can change a traced kernel or its result.

A key is built once per call from exactly what the dispatch mode receives
(the dispatcher has already dropped trailing defaults and unwrapped Python
scalars), hashes once, and compares by value:

* the op overload;
* per tensor: shape, stride, storage offset, dtype, device, layout, conj and
  neg bits, and which earlier argument it is *the same object* as (the
  kernel's placeholders are per object);
* every other argument, recursively, as ``(type(x), x)``: ``1`` and ``1.0``
  promote differently, so they must not share a kernel;
* ambient state: default dtype, grad mode, inference mode, deterministic flag (and warn-only).

A call that cannot be keyed raises :class:`Bypass` with a reason, and is then
decomposed eagerly (still only opset ops below), never replayed.
"""

from __future__ import annotations

import torch

from eagerdecomp.runtime.lift import Lifted

__all__ = ["Key", "Bypass", "make_key", "make_key_py", "IMPLEMENTATION"]

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_strided = torch.strided

# Argument types that are hashable and compare by value (Lifted: a float's value class).
_PLAIN = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format, Lifted})


class Bypass(Exception):
    """This call cannot be cached; ``reason`` is counted in the report."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Key:
    """Frozen and hashed once: dict lookups and LRU bookkeeping reuse the hash."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self._hash == other._hash and self.parts == other.parts

    def __repr__(self) -> str:
        return f"Key{self.parts!r}"


def _float_key(x: float):
    # NOTE: nan != nan would make every nan call a miss, and 0.0 == -0.0 would
    # let mul(x, -0.0) replay a kernel traced with 0.0: key those two by text.
    if x != x or x == 0.0:
        return (float, repr(x))
    return (float, x)


def _visit(x, parts: list, tensors: list) -> None:
    t = type(x)
    if t is _Tensor or t is _Parameter:
        if x.layout is not _strided:
            raise Bypass(f"{x.layout} tensor")
        tensors.append(x)
        parts.append((x.shape, x.stride(), x.storage_offset(), x.dtype, x.device, x.is_conj(), x.is_neg()))
    elif t in _PLAIN:
        parts.append((t, x))
    elif t is float:
        parts.append(_float_key(x))
    elif t is list or t is tuple:
        parts.append((t, len(x)))
        for y in x:
            _visit(y, parts, tensors)
    elif t is complex:
        parts.append((t, repr(x)))
    elif isinstance(x, _Tensor):
        raise Bypass(f"tensor subclass {t.__name__}")
    elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Bypass("symbolic shape argument")
    elif t is torch.Generator:
        # a traced kernel would bake the generator object in; run eagerly with it instead
        raise Bypass("explicit generator argument")
    else:
        raise Bypass(f"unkeyable argument of type {t.__name__}")


def make_key_py(func, args: tuple, kwargs: dict):
    """Return ``(Key, tensors)``: the key of this call and its tensor arguments, in order.

    Raises :class:`Bypass` when the call cannot be keyed.
    """
    parts: list = [func]
    tensors: list = []
    for a in args:
        _visit(a, parts, tensors)
    for k, v in kwargs.items():
        parts.append(k)
        _visit(v, parts, tensors)
    if len(tensors) > 1:
        ids = [id(t) for t in tensors]
        if len(set(ids)) != len(ids):
            parts.append(tuple(ids.index(i) for i in ids))
    parts.append(ambient_state())
    return Key(tuple(parts)), tensors


def ambient_state() -> tuple:
    """Process/thread state that decompositions read: part of every key."""
    return (
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),  # an alert raises or warns
    )


def _load_native():
    """The C++ builder (csrc/key.cpp) if the extension is available: same fields, 2.5-3.4x faster."""
    from eagerdecomp.runtime import library as _ext

    lib = _ext.load()
    if lib is None or not hasattr(lib, "make_key"):
        return None
    lib._init_key(Bypass, (Lifted,))
    native = lib.make_key

    def make_key_native(func, args: tuple, kwargs: dict):
        parts, tensors = native(func, args, kwargs)
        return Key(parts), tensors

    return make_key_native


make_key = _load_native() or make_key_py
IMPLEMENTATION = "c++" if make_key is not make_key_py else "python"
