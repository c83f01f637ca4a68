"""What a decomposed ``out=`` call leaves behind, against native eager, under the mode and on
the reference device with the switch: the out's strides when it is the right size, its
version counter, and eager's warnings (category, message, and the file and line they name).

Each call runs natively on CPU first, then the same way under ``EagerDecompMode("core_aten")``
(CPU tensors) and on ``edref`` with ``ed.enable`` (the tensors moved there), twice: the first
call traces, the second replays.
"""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import eagerdecomp as ed
from eagerdecomp import device as device_switch
from eagerdecomp.errors import BackendError

refdev = pytest.importorskip("eagerdecomp.device.refdev")
try:
    DEV = refdev.reference_device()
except BackendError as e:  # no compiler here: the mode's half still runs
    DEV, _NO_DEVICE = None, str(e)

WHERE = ("mode", "edref")


@pytest.fixture
def where(request, monkeypatch):
    name = request.param
    if name == "mode (Python path)":  # the mode's TorchDispatchMode path, which it takes without its C++ key
        monkeypatch.setenv("EAGERDECOMP_KEY_MODE", "0")
        yield name
    elif name == "edref":
        if DEV is None:
            pytest.skip(f"reference device unavailable: {_NO_DEVICE}")
        device_switch.disable(DEV)
        device_switch.enable(DEV)
        yield name
        device_switch.disable(DEV)
    else:
        yield name


PATHS: list = []  # the path each mode run took (mode.path), latest last


def run(where, fn, *tensors):
    """``fn(*tensors)`` natively (``"native"``), under the mode, or on edref (tensors copied there,
    with their strides and storage offsets); returns ``fn``'s result and the tensors it got."""
    if where == "edref":
        tensors = [_to_device(t) for t in tensors]
    if where.startswith("mode"):
        with ed.EagerDecompMode("core_aten") as mode:
            out = fn(*tensors)
        PATHS.append(mode.path)
        return out, tensors
    return fn(*tensors), tensors


def _to_device(t):
    n = t.untyped_storage().nbytes() // t.element_size()
    base = t.as_strided((n,), (1,), 0).to(DEV)  # the whole storage, a fresh tensor (version 0)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def layout(t):
    return t.dtype, tuple(t.shape), t.stride(), t.storage_offset()


# -- a right-sized out keeps its strides -------------------------------------------------------

SPD = torch.randn(4, 4, dtype=torch.float64)
SPD = SPD @ SPD.mT + 4 * torch.eye(4, dtype=torch.float64)
B = torch.randn(4, 3, dtype=torch.float64)

# (fn, its inputs, the out's shape); each out is given row-major, column-major and strided
LAPACK_OUTS = {
    "linalg.solve": (lambda A, B, o: torch.linalg.solve(A, B, out=o), (SPD, B), (4, 3)),
    "linalg.solve(left=False)": (lambda A, B, o: torch.linalg.solve(A, B.mT, left=False, out=o), (SPD, B), (3, 4)),
    "linalg.inv": (lambda A, o: torch.linalg.inv(A, out=o), (SPD,), (4, 4)),
    "linalg.cholesky": (lambda A, o: torch.linalg.cholesky(A, out=o), (SPD,), (4, 4)),
    "cholesky_solve": (lambda A, B, o: torch.cholesky_solve(B, torch.linalg.cholesky(A), out=o), (SPD, B), (4, 3)),
    "linalg.solve_triangular": (
        lambda A, B, o: torch.linalg.solve_triangular(A.tril(), B, upper=False, out=o),
        (SPD, B),
        (4, 3),
    ),
}


def _outs(shape):
    m, n = shape
    return {
        "row-major": torch.zeros(m, n, dtype=torch.float64),
        "column-major": torch.zeros(n, m, dtype=torch.float64).mT,
        "strided": torch.zeros(m, 2 * n, dtype=torch.float64)[:, 1::2],
    }


@pytest.mark.parametrize("where", WHERE, indirect=True)
@pytest.mark.parametrize("name", LAPACK_OUTS)
def test_a_right_sized_out_keeps_its_strides(where, name):
    fn, inputs, shape = LAPACK_OUTS[name]
    for kind in ("row-major", "column-major", "strided"):
        want_out = _outs(shape)[kind]
        want = fn(*inputs, want_out)
        for _ in range(2):  # traced, then replayed
            got, (*_, out) = run(where, fn, *inputs, _outs(shape)[kind])
            assert got is out, kind
            assert layout(out) == layout(want_out), (kind, layout(out), layout(want_out))
            assert layout(got) == layout(want), kind
            torch.testing.assert_close(out.cpu(), want_out)


@pytest.mark.parametrize("where", WHERE, indirect=True)
def test_a_resized_out_still_takes_eagers_strides(where):
    # the other side of the rule: an out of another size is resized to the kernel's layout
    fn, inputs, _ = LAPACK_OUTS["linalg.solve"]
    want_out = torch.zeros(0, dtype=torch.float64)
    fn(*inputs, want_out)
    got, (*_, out) = run(where, fn, *inputs, torch.zeros(0, dtype=torch.float64))
    assert layout(out) == layout(want_out)
    torch.testing.assert_close(out.cpu(), want_out)


# -- version counters -------------------------------------------------------------------------


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + len(shape))).to(dtype)


# (fn(*inputs, out), inputs, out's shape): composite (CompositeImplicitAutograd) out= ops. Eager
# runs their composite kernel above autograd, and each in-place write of the out that reaches
# ADInplaceOrView advances its version: the final copy_ or inner out= op (kron's goes through an
# _unsafe_view, which has a version counter of its own: 0). An out the composite resizes is one
# write more where ATen's resize_output dispatches resize_: for a tensor not on the CPU, or under
# any Python dispatch mode (isTensorSubclassLike); on the CPU without one it resizes in place,
# unseen. The truth is native eager on the same device: the CPU's with no mode for the mode's C++
# key (a dispatch key, not a Python mode: ATen resizes in place as with no mode at all), another
# device's (the meta device) for edref. eagerdecomp must add nothing to either.
# NOTE: the mode's Python path is a Python dispatch mode, so ATen dispatches that resize_ and
# autograd's ADInplaceOrView, above any mode, counts it: one more than the CPU for a resized out,
# as under any TorchDispatchMode. No mode can undo a count made above it (docs/limits.md); the
# test pins it to exactly eager's count under a do-nothing Python mode.
COMPOSITE_OUTS = {
    "kron": (lambda a, b, o: torch.kron(a, b, out=o), (_r(2, 3), _r(3, 2)), (6, 6)),
    "matrix_power": (lambda a, o: torch.linalg.matrix_power(a, 3, out=o), (_r(3, 3),), (3, 3)),
    "inner": (lambda a, b, o: torch.inner(a, b, out=o), (_r(3, 4), _r(2, 4)), (3, 2)),
    "tensordot": (lambda a, b, o: torch.tensordot(a, b, dims=1, out=o), (_r(3, 4), _r(4, 2)), (3, 2)),
    "linalg.norm": (lambda a, o: torch.linalg.norm(a, out=o), (_r(3, 4),), ()),
    "linalg.matrix_norm": (lambda a, o: torch.linalg.matrix_norm(a, out=o), (_r(3, 4),), ()),
    "linalg.multi_dot": (
        lambda a, b, c, o: torch.linalg.multi_dot([a, b, c], out=o),
        (_r(3, 4), _r(4, 5), _r(5, 2)),
        (3, 2),
    ),
    "linalg.tensorinv": (lambda a, o: torch.linalg.tensorinv(a, ind=1, out=o), (_r(4, 2, 2),), (2, 2, 4)),
    "linalg.tensorsolve": (lambda a, b, o: torch.linalg.tensorsolve(a, b, out=o), (_r(2, 3, 6), _r(2, 3)), (6,)),
}


class _DoNothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _eager_version(where, path, fn, inputs, out):
    """The out's version after ``fn`` natively, in the conditions eager meets under ``where``
    (``path``: the mode's, ``mode.path``)."""
    if where == "edref":
        fn(*[t.to("meta") for t in inputs], out := out.to("meta"))
    elif path.startswith("Python"):
        with _DoNothing():
            fn(*inputs, out)
    else:
        fn(*inputs, out)
    return out._version


@pytest.mark.parametrize("where", (*WHERE, "mode (Python path)"), indirect=True)
@pytest.mark.parametrize("name", COMPOSITE_OUTS)
@pytest.mark.parametrize("sized", ["right-sized", "empty"])
def test_out_version_counts_equal_eagers(where, name, sized):
    fn, inputs, shape = COMPOSITE_OUTS[name]

    def out():
        return torch.zeros(shape if sized == "right-sized" else (0,))

    want_out = out()
    fn(*inputs, want_out)
    for _ in range(2):  # traced, then replayed
        got, (*_, o) = run(where, fn, *inputs, out())
        path = PATHS[-1] if where != "edref" else ""
        if where == "mode (Python path)":
            assert path.startswith("Python"), path
        want = _eager_version(where, path, fn, inputs, out())
        if sized == "right-sized":
            assert want == want_out._version  # (the conditions change nothing here)
        assert got is o
        assert o._version == want, (path, o._version, want)
        assert layout(o) == layout(want_out)
        torch.testing.assert_close(o.cpu(), want_out, rtol=1e-5, atol=1e-5)


# -- warnings ---------------------------------------------------------------------------------


def _recorded(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [(w.category, str(w.message), w.filename, w.lineno) for w in caught]


# (fn(*inputs, out), inputs, out's dtype)
RESIZED = {
    "expit (pointwise out=)": (lambda x, o: torch.special.expit(x, out=o), (_r(5),), torch.float32),
    "kron (composite out=)": (lambda a, b, o: torch.kron(a, b, out=o), (_r(2, 2), _r(2, 2)), torch.float32),
    "linalg.solve (LAPACK out=)": (lambda A, B, o: torch.linalg.solve(A, B, out=o), (SPD, B), torch.float64),
    "nonzero (decomposed on every call)": (lambda x, o: torch.nonzero(x, out=o), (_r(3, 4) > 0,), torch.int64),
}


@pytest.mark.parametrize("where", WHERE, indirect=True)
@pytest.mark.parametrize("name", RESIZED)
def test_resize_warning_is_eagers_at_the_callers_line(where, name):
    # NOTE: the file and line matter: Python's "default" filter shows a warning once per line, so
    # a warning attributed to one of eagerdecomp's lines was shown once for all call sites
    fn, inputs, dtype = RESIZED[name]
    _, want = _recorded(lambda: fn(*inputs, torch.zeros(2, dtype=dtype)))  # non-empty, another size
    assert len(want) == 1 and want[0][0] is UserWarning and "was resized" in want[0][1]
    for _ in range(2):  # traced, then replayed
        _, got = _recorded(lambda: run(where, fn, *inputs, torch.zeros(2, dtype=dtype)))
        assert got == want


def _run(code: str, **env_vars) -> str:
    env = dict(**__import__("os").environ, EAGERDECOMP_DISK="0")
    env.update(env_vars)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


_SCATTER = """
    import contextlib, sys, warnings, torch, eagerdecomp as ed
    from eagerdecomp.testing import reference_device
    where = {where!r}
    dev = reference_device() if where == "edref" else "cpu"
    if where == "edref":
        ed.enable(dev)
    torch.set_warn_always({always!r})
    x, i, s = torch.zeros(3, 4).to(dev), torch.tensor([[0, 1, 2, 0]]).to(dev), torch.ones(1, 4).to(dev)
    mode = ed.EagerDecompMode("core_aten") if where == "mode" else contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as w, mode:
        warnings.simplefilter("always")
        for _ in range(3):
            x.scatter_(0, i, s, reduce="add")  # (one line for every side: the line is compared too)
    print(repr([(c.category.__name__, str(c.message), c.lineno) for c in w]), x.sum().item())
    if where == "mode":  # (how the mode served the calls: traced, or loaded from the disk cache)
        row = mode.report().row(torch.ops.aten.scatter_.reduce)
        print(row.traces, row.loaded, file=sys.stderr)
"""


@pytest.mark.parametrize("where", WHERE)
def test_scatter_reduce_deprecation_is_raised_once_per_process_as_eager(where):
    # NOTE: eager raises it once per process (TORCH_WARN_ONCE in the op's meta function): each
    # side runs in a fresh process, two calls each, so the second must be silent on both
    if where == "edref" and DEV is None:
        pytest.skip(f"reference device unavailable: {_NO_DEVICE}")
    want = _run(_SCATTER.format(where="native", always=False))
    assert "is deprecated" in want
    assert _run(_SCATTER.format(where=where, always=False)) == want


def _run_both(code: str, **env_vars) -> tuple:
    env = {**__import__("os").environ, **env_vars}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr.splitlines()[-1] if r.stderr else ""


@pytest.mark.parametrize("always", [False, True])
@pytest.mark.parametrize("where", WHERE)
def test_scatter_reduce_deprecation_from_a_disk_cache_kernel_is_eagers(where, always, tmp_path):
    # NOTE: a fresh process whose first call is served by a kernel an earlier process saved (no
    # trace, so no lowering fires the warning): eager's flag is asked on each call, so it warns once
    # per process, or on every call under torch.set_warn_always(True)
    if where == "edref" and DEV is None:
        pytest.skip(f"reference device unavailable: {_NO_DEVICE}")
    disk = dict(EAGERDECOMP_CACHE_DIR=str(tmp_path), EAGERDECOMP_DISK_CACHE="1")
    want = _run(_SCATTER.format(where="native", always=always))
    assert want.count("is deprecated") == (3 if always else 1)
    first, first_routes = _run_both(_SCATTER.format(where=where, always=always), **disk)
    second, second_routes = _run_both(_SCATTER.format(where=where, always=always), **disk)
    assert first == want and second == want
    if where == "mode":
        assert (first_routes, second_routes) == ("1 0", "0 1")  # traced, then loaded from the disk


@pytest.mark.usefixtures("trace_first")  # the warning on replays of a traced kernel
def test_scatter_reduce_deprecation_on_replays_under_warn_always():
    # in process: eager's flag has fired already; with warn_always eager warns on every call,
    # and so must the mode's replays of the traced kernel
    x, i, s = torch.zeros(3, 4), torch.tensor([[0, 1, 2, 0]]), torch.ones(1, 4)

    def calls(mode):
        with warnings.catch_warnings(record=True) as w, mode:
            warnings.simplefilter("always")
            for _ in range(3):
                x.scatter_(0, i, s, reduce="multiply")
        return [(c.category, str(c.message), c.lineno) for c in w]

    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        want = calls(__import__("contextlib").nullcontext())
        mode = ed.EagerDecompMode("core_aten")
        got = calls(mode)  # (entered once, inside calls: entering it twice counts each call twice)
        row = mode.report().row(torch.ops.aten.scatter_.reduce)
    finally:
        torch.set_warn_always(before)
    assert len(want) == 3 and "is deprecated" in want[0][1]
    assert got == want
    assert (row.traces, row.hits) == (1, 2)
