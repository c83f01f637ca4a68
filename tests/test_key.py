"""Key fields, one test each: key(x) == key(y) != key(z)."""

import pytest
import torch

from eagerdecomp import key as keymod
from eagerdecomp.key import Bypass, Key

aten = torch.ops.aten
add = aten.add.Tensor

# every test runs against the pure-Python builder and, when built, the C++ one
BUILDERS = {"python": keymod.make_key_py}
if keymod.IMPLEMENTATION == "c++":
    BUILDERS["c++"] = keymod.make_key


@pytest.fixture(autouse=True, params=sorted(BUILDERS))
def builder(request, monkeypatch):
    monkeypatch.setattr(keymod, "make_key", BUILDERS[request.param])
    return BUILDERS[request.param]


def make_key(func, args, kwargs):
    return keymod.make_key(func, args, kwargs)


def key(*args, op=add, **kwargs):
    return make_key(op, args, kwargs)[0]


def check(same_a, same_b, other):
    assert same_a == same_b and hash(same_a) == hash(same_b)
    assert same_a != other


def test_op_overload():
    x = torch.randn(3)
    check(key(x, x), key(x, x), key(x, x, op=aten.mul.Tensor))


def test_shape():
    check(key(torch.randn(3, 4)), key(torch.randn(3, 4)), key(torch.randn(4, 3)))


def test_stride():
    a = torch.randn(4, 4)
    check(key(a), key(torch.randn(4, 4)), key(a.t()))


def test_storage_offset():
    base, other = torch.randn(10), torch.randn(10)
    check(key(base[1:5]), key(other[1:5]), key(base[0:4]))


def test_dtype():
    check(key(torch.ones(3)), key(torch.zeros(3)), key(torch.ones(3, dtype=torch.float64)))


def test_device():
    check(key(torch.ones(3)), key(torch.ones(3)), key(torch.ones(3, device="meta")))


def test_conj_bit():
    z = torch.randn(3, dtype=torch.complex64)
    check(key(z), key(torch.randn(3, dtype=torch.complex64)), key(z.conj()))


def test_neg_bit():
    x = torch.randn(3)
    check(key(x), key(torch.randn(3)), key(torch._neg_view(x)))


def test_scalar_type_int_vs_float_vs_bool():
    x = torch.ones(3)
    check(key(x, other=1), key(x, other=1), key(x, other=1.0))
    assert key(x, other=1) != key(x, other=True)


def test_scalar_value():
    x = torch.ones(3)
    check(key(x, 2.0), key(x, 2.0), key(x, 3.0))


def test_signed_zero_and_nan():
    x = torch.ones(3)
    check(key(x, 0.0), key(x, 0.0), key(x, -0.0))
    check(key(x, float("nan")), key(x, float("nan")), key(x, float("inf")))


def test_list_arguments_and_length():
    x = torch.ones(2, 3)
    op = aten.sum.dim_IntList
    check(key(x, [0], op=op), key(x, [0], op=op), key(x, [0, 1], op=op))
    check(key(x, [0], op=op), key(x, [0], op=op), key(x, [1], op=op))


def test_kwarg_name():
    x = torch.ones(3)
    check(key(x, x, alpha=2), key(x, x, alpha=2), key(x, x, beta=2))


def test_same_object_pattern():
    x, y = torch.ones(3), torch.ones(3)
    check(key(x, x), key(y, y), key(x, y))


def test_default_dtype():
    x = torch.ones(3)
    a = key(x)
    torch.set_default_dtype(torch.float64)
    try:
        other = key(x)
    finally:
        torch.set_default_dtype(torch.float32)
    check(a, key(x), other)


def test_grad_mode():
    x = torch.ones(3)
    with torch.no_grad():
        other = key(x)
    check(key(x), key(x), other)


def test_inference_mode():
    x = torch.ones(3)
    with torch.inference_mode():
        other = key(x)
    check(key(x), key(x), other)


def test_deterministic_flag():
    x = torch.ones(3)
    torch.use_deterministic_algorithms(True)
    try:
        other = key(x)
    finally:
        torch.use_deterministic_algorithms(False)
    check(key(x), key(x), other)


def test_tensors_are_returned_in_order():
    x, y = torch.ones(3), torch.zeros(3)
    _, tensors = make_key(aten.cat.default, ([x, y],), {})
    assert tensors[0] is x and tensors[1] is y


def test_key_hash_is_computed_once():
    k = key(torch.ones(3))
    assert isinstance(k, Key) and k._hash == hash(k.parts)


def test_builder_in_use_is_reported():
    assert keymod.IMPLEMENTATION in ("c++", "python")


@pytest.mark.parametrize(
    "arg, reason",
    [
        (torch.Generator(), "generator"),
        (torch.ones(2).to_sparse(), "sparse"),
        (object(), "unkeyable"),
    ],
)
def test_bypass_reasons(arg, reason):
    with pytest.raises(Bypass, match=reason):
        make_key(add, (torch.ones(2), arg), {})


def test_tensor_subclass_bypasses():
    class Sub(torch.Tensor):
        pass

    with pytest.raises(Bypass, match="subclass"):
        make_key(add, (torch.ones(2).as_subclass(Sub),), {})
