"""Schema questions, answered in one place: which op a name means, every overload of a
namespace, and what an op writes.

Example::

    >>> import torch
    >>> from eagerdecomp.ops import schema
    >>> schema.op_from_name("aten::add.out") is torch.ops.aten.add.out
    True
    >>> schema.is_out(torch.ops.aten.add.out), schema.is_inplace(torch.ops.aten.add_.Tensor)
    (True, True)
    >>> schema.written(torch.ops.aten.add.out)
    ('out',)
"""

from __future__ import annotations

import functools

import torch
from torch._ops import OpOverload, OpOverloadPacket

__all__ = [
    "op_from_name",
    "op_names",
    "overloads",
    "written",
    "out_args",
    "is_out",
    "is_inplace",
    "returns_tensor",
    "resizes_like_functional",
]


def op_from_name(name: str) -> OpOverload | OpOverloadPacket | None:
    """``"aten::add.Tensor"`` (or ``"aten.add.Tensor"``, ``"add"``) -> the op; a name without an
    overload gives the packet; None if torch has no such op. ``aten`` is the default namespace."""
    ns, sep, rest = name.replace("::", ".", 1).partition(".")
    if not sep:
        ns, rest = "aten", name
    packet_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), packet_name)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=1)
def op_names() -> tuple:
    """Every operator name the dispatcher has (``ns::name.overload``), read once."""
    return tuple(torch._C._dispatch_get_all_op_names())


@functools.cache
def overloads(namespace: str) -> tuple:
    """Every ``OpOverload`` of ``namespace`` the dispatcher has, in its order (read once)."""
    out = []
    for name in op_names():
        if name.startswith(namespace + "::"):
            op = op_from_name(name if "." in name else name + ".default")
            if isinstance(op, OpOverload):
                out.append(op)
    return tuple(out)


@functools.cache
def written(op: OpOverload) -> tuple:
    """Names of the arguments ``op`` writes (``Tensor(a!)`` in its schema), in order."""
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


@functools.cache
def out_args(op: OpOverload) -> tuple:
    """Names of ``op``'s out= arguments: the keyword-only arguments it writes."""
    return tuple(
        a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    )


@functools.cache
def returns_tensor(op: OpOverload) -> bool:
    """Whether any of ``op``'s results is a tensor (or a list of them); ``is_set_to`` returns a bool."""
    return any("Tensor" in str(r.type) for r in op._schema.returns)


@functools.cache
def _functional_layout_outs() -> frozenset:
    """``"add.out"``-style names of the out= overloads that resize ``out`` as their functional
    op allocates its result, read from the ``native_functions.yaml`` that torch ships in
    ``torchgen`` (empty if it is absent): structured kernels (their generated ``resize_out``
    restrides a resized out to the strides the meta function sets, the functional result's),
    and TensorIterator kernels that are not structured (marked ``NoCheck   # TensorIterator``)."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("torchgen")
    path = (
        pathlib.Path(spec.origin).parent / "packaged/ATen/native/native_functions.yaml"
        if spec and spec.origin
        else None
    )
    if path is None or not path.is_file():
        return frozenset()
    names, current = set(), None
    for line in path.read_text().splitlines():
        if line.startswith("- func:"):
            current = line.split(":", 1)[1].strip().split("(", 1)[0]
        elif current and (
            line.strip() in ("structured: True", "structured_inherits: TensorIteratorBase")
            or "NoCheck   # TensorIterator" in line
        ):
            names.add(current)
    # NOTE: addr's kernel is a TensorIterator the yaml does not mark (found by the layouts sweep)
    return frozenset(n for n in names if "." in n) | {"addr.out"}


@functools.cache
def resizes_like_functional(op: OpOverload) -> bool:
    """An out= overload whose kernel, when it resizes ``out``, gives it the strides of the
    functional op's result (a column-major input makes a column-major out). Other kernels
    resize ``out`` contiguous."""
    # NOTE: pointwise ops' kernels are TensorIterators too, declared structured or not (abs.out)
    name = f"{op._schema.name.split('::')[-1]}.{op._schema.overload_name}"
    return is_out(op) and (name in _functional_layout_outs() or torch.Tag.pointwise in op.tags)


def is_out(op: OpOverload) -> bool:
    """An out= overload: it writes keyword-only ``out`` arguments (``add.out``, ``max.dim_max``)."""
    return bool(out_args(op))


def is_inplace(op: OpOverload) -> bool:
    """An in-place overload: it writes an argument that is not an out= one (``add_``, ``copy_``)."""
    return len(written(op)) > len(out_args(op))
