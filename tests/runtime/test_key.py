"""Key fields, one test each: key(x) == key(y) != key(z)."""

import pytest
import torch

from eagerdecomp.runtime import key as keymod
from eagerdecomp.runtime.key import Bypass, Key

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


# ---- the C++ builder against the Python one, call by call -------------------------------

needs_cpp = pytest.mark.skipif("c++" not in BUILDERS, reason="C++ key builder not built")


class _FloatSub(float):
    pass


class _IntSub(int):
    pass


def _parity_corpus():
    """(label, func, args, kwargs): varied calls both builders must key identically."""
    from eagerdecomp.runtime.lift import _CLASSES

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    base = torch.randn(64, generator=g)
    z = torch.randn(2, 3, dtype=torch.complex64, generator=g)
    nchw = torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)
    tensors = {
        "contiguous": x,
        "transposed": x.t(),
        "offset slice": base[5:17],
        "strided offset": base[3::4],
        "view 3d": base.view(4, 4, 4).permute(2, 0, 1),
        "expanded": torch.randn(1, 4, generator=g).expand(5, 4),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "float64": x.double(),
        "int64": torch.arange(6).view(2, 3),
        "bool": x > 0,
        "float16": x.half(),
        "bfloat16": x.bfloat16(),
        "complex": z,
        "conj view": z.conj(),
        "neg view": torch._neg_view(x),
        "conj of neg": torch._neg_view(z).conj(),
        "channels_last": nchw,
        "meta": torch.empty(2, 7, device="meta"),
        "meta strided": torch.empty_strided((3, 2), (1, 5), device="meta"),
        "parameter": torch.nn.Parameter(torch.ones(2, 2)),
        "requires_grad leaf": torch.ones(3, requires_grad=True),
    }
    calls = [
        (f"tensor {k}", aten.add.Tensor, (t, t.clone() if t.device.type != "meta" else t), {})
        for k, t in tensors.items()
    ]
    floats = [0.5, -3.25, 0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1e-300, 5e-324, 1e300]
    calls += [(f"float {v!r}", aten.add.Tensor, (x, v), {}) for v in floats]
    calls += [(f"float kwarg {v!r}", aten.addcmul.default, (x, x, y), {"value": v}) for v in floats]
    ints = [0, 1, -1, 7, 2**62, -(2**63), 2**70, True, False]
    calls += [(f"int {v!r}", aten.add.Tensor, (x, y), {"alpha": v}) for v in ints]
    calls += [
        (f"complex {v!r}", aten.mul.Scalar, (z, v), {})
        for v in (1 + 2j, complex(0.0, -0.0), complex(float("nan"), 1.0), complex(float("inf"), 0))
    ]
    calls += [
        ("tensor list", aten.cat.default, ([x, y, x.t().contiguous()], 1), {}),
        ("nested lists", aten.index.Tensor, (x, [None, torch.tensor([0, 2])]), {}),
        ("nested tuple", aten.add.Tensor, (x, ((1, [2.0, (None, "s")]), [])), {}),
        ("int list", aten.sum.dim_IntList, (x, [0, -1], True), {"dtype": torch.float64}),
        ("empty list", aten.sum.dim_IntList, (x, []), {}),
        ("same object twice", aten.add.Tensor, (x, x), {}),
        ("same object pattern", aten.addcmul.default, (x, y, x), {"value": 2.0}),
        ("same object via list", aten.cat.default, ([x, y, y, x],), {}),
        ("many tensors, repeats", aten.cat.default, ([x, y] * 20 + [base[:12].view(3, 4)],), {}),
        ("many distinct tensors", aten.cat.default, ([torch.ones(1) for _ in range(40)],), {}),
        (
            "plain kwargs",
            aten.empty_strided.default,
            ((2, 3), (3, 1)),
            {"dtype": torch.float16, "layout": torch.strided, "device": torch.device("cpu"), "pin_memory": False},
        ),
        ("to device", aten.to.device, (x, torch.device("meta"), torch.float64), {}),
        ("memory format", aten.clone.default, (nchw,), {"memory_format": torch.channels_last}),
        ("None and str", aten.div.Tensor_mode, (x, y), {"rounding_mode": "floor"}),
        ("None rounding", aten.div.Tensor_mode, (x, y), {"rounding_mode": None}),
        ("no args", aten.randn.default, ([2, 3],), {}),
    ]
    calls += [(f"lifted {m!r}", aten.addcmul.default, (x, y, x), {"value": m}) for m in _CLASSES.values()]
    return calls


def _same(a, b, path="parts"):
    """Equal, same types all the way down (torch.Size stays torch.Size), equal hashes."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if type(a) in (tuple, torch.Size):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (u, v) in enumerate(zip(a, b)):
            _same(u, v, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"
    assert hash(a) == hash(b), f"{path}: hashes differ"


def _both(func, args, kwargs):
    py_key, py_tensors = keymod.make_key_py(func, args, kwargs)
    c_key, c_tensors = BUILDERS["c++"](func, args, kwargs)
    return (py_key, py_tensors), (c_key, c_tensors)


@needs_cpp
@pytest.mark.parametrize("label, func, args, kwargs", _parity_corpus(), ids=lambda v: v if isinstance(v, str) else "")
def test_cpp_parts_equal_python_parts(label, func, args, kwargs):
    for ambient in (_no_change, torch.no_grad, torch.inference_mode, _default_float64):
        with ambient():
            (py_key, py_tensors), (c_key, c_tensors) = _both(func, args, kwargs)
        _same(py_key.parts, c_key.parts)
        assert py_key == c_key and hash(py_key) == hash(c_key)
        assert len(py_tensors) == len(c_tensors) and all(a is b for a, b in zip(py_tensors, c_tensors))


class _no_change:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _default_float64:
    def __enter__(self):
        torch.set_default_dtype(torch.float64)

    def __exit__(self, *exc):
        torch.set_default_dtype(torch.float32)
        return False


def _bypass_corpus():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class Sub(torch.Tensor):
        pass

    env = ShapeEnv()
    cases = [
        ("generator", torch.Generator()),
        ("sparse coo", torch.ones(2).to_sparse()),
        ("sparse csr", torch.eye(2).to_sparse_csr()),
        ("subclass", torch.ones(2).as_subclass(Sub)),
        ("symint", env.create_unbacked_symint()),
        ("symfloat", env.create_unbacked_symfloat()),
        ("object", object()),
        ("float subclass", _FloatSub(1.5)),
        ("int subclass", _IntSub(3)),
        ("torch.Size", torch.Size([2, 3])),
        ("dict", {"a": 1}),
        ("set", {1}),
        ("bytes", b"x"),
        ("function", len),
        ("inside a list", [1, [torch.Generator()]]),
    ]
    try:
        import numpy

        cases.append(("numpy float64", numpy.float64(1.0)))
    except ImportError:
        pass
    return cases


@needs_cpp
@pytest.mark.parametrize("label, arg", _bypass_corpus(), ids=lambda v: v if isinstance(v, str) else "")
def test_cpp_bypass_reasons_equal_python(label, arg):
    x = torch.ones(2)
    for args, kwargs in (((x, arg), {}), ((x,), {"other": arg})):
        errors = []
        for build in (keymod.make_key_py, BUILDERS["c++"]):
            with pytest.raises(Exception) as info:
                build(add, args, kwargs)
            errors.append(info.value)
        py_err, c_err = errors
        assert type(py_err) is type(c_err), (py_err, c_err)
        assert str(py_err) == str(c_err)
        if isinstance(py_err, Bypass):
            assert py_err.reason == c_err.reason


@needs_cpp
def test_cpp_builder_raises_what_python_raises_for_strideless_tensor():
    # a nested tensor has strided layout but no strides: both builders must fail alike
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    errors = []
    for build in (keymod.make_key_py, BUILDERS["c++"]):
        try:
            build(add, (nt,), {})
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - comparing whatever each raises
            errors.append(e)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])


@needs_cpp
@pytest.mark.parametrize("transform", ["vmap", "functionalize"])
def test_cpp_parts_equal_python_parts_under_functorch(transform):
    # functorch wraps plain tensors (exact type torch.Tensor) whose sizes are logical
    seen = []

    def f(x):
        args = (x, x.t(), [x, 2.0])
        (py_key, _), (c_key, _) = _both(aten.add.Tensor, args, {"alpha": 3})
        seen.append((py_key, c_key))
        return x

    if transform == "vmap":
        torch.vmap(f)(torch.ones(5, 2, 3))
    else:
        torch.func.functionalize(f)(torch.ones(2, 3))
    assert seen
    for py_key, c_key in seen:
        _same(py_key.parts, c_key.parts)
