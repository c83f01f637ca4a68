"""The CPU tier over odd layouts: the same memory on edref and on the CPU, the same answers.

Every case builds one base per side from the same bytes, takes the same views of it
(expanded, stride 0, overlapping, offset, transposed, strided, the same tensor twice in a
list), runs the op through the tier's mechanism on edref (``host.run``, the C++ path every
tier call takes) and natively on the CPU, then compares the *bases* bitwise: whatever the
CPU kernel read or wrote through a view (a fused optimizer writes numel elements from the
data pointer whatever the strides) must land where eager put it, and nothing else may move.
Results are compared for values, dtype, shape and strides; eager's errors for eager's.

The end-to-end cases at the bottom go through the device switch, where autograd sits above
the tier: version counters and inference-mode tensors as eager has them.
"""

import itertools
import warnings

import pytest
import torch

from eagerdecomp import device as device_switch
from eagerdecomp.errors import BackendError
from eagerdecomp.runtime import library

refdev = pytest.importorskip("eagerdecomp.device.refdev")
try:
    DEV = refdev.reference_device()
except BackendError as e:
    pytest.skip(f"reference device unavailable: {e}", allow_module_level=True)
LIB = library.load()
if LIB is None or not hasattr(LIB, "host"):
    pytest.skip("the CPU tier needs the C++ library", allow_module_level=True)

aten = torch.ops.aten
SHAPE = (6, 8)


# -- layouts: (base size, a function from the base to a (6, 8) tensor) -------------------
# Each base has room for numel elements from every view's data pointer: fused kernels read
# that far, and past a storage's end eager itself reads garbage.
LAYOUTS = {
    "contiguous": (48, lambda b: b.view(6, 8)),
    "offset": (64, lambda b: b[7:55].view(6, 8)),
    "transposed": (48, lambda b: b.view(8, 6).t()),
    "strided": (112, lambda b: b[:96].view(6, 16)[:, 1::2]),
    "expanded row": (48, lambda b: b.view(6, 8)[:1].expand(6, 8)),
    "stride 0": (56, lambda b: b[3:4].view(1, 1).expand(6, 8)),
    "overlapping": (64, lambda b: b.as_strided((6, 8), (2, 1), 5)),
}
# layouts whose elements are distinct memory: eager writes them; the others only read
WRITABLE = ("contiguous", "offset", "transposed", "strided")


def pair(size, make, seed, dtype=torch.float32):
    """The same view of the same bytes on the CPU and on edref, and both bases."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(size, generator=g, dtype=torch.float64).to(dtype) + 0.5
    dbase = base.to(DEV)
    return (base, make(base)), (dbase, make(dbase))


def run_both(op, build):
    """``build(side)`` makes one side's (bases, args, kwargs); runs op natively and through
    the tier; returns both sides' (bases, result or exception type)."""
    out = []
    for side in (0, 1):
        bases, args, kwargs = build(side)
        try:
            res = op(*args, **kwargs) if side == 0 else LIB.host.run(op, args, kwargs, DEV)[0]
        except RuntimeError as e:
            res = type(e)
        out.append((bases, res))
    return out


def same_tensor(c, d, bitwise=True):
    assert d.device == DEV
    assert (d.dtype, d.shape, d.stride()) == (c.dtype, c.shape, c.stride())
    if bitwise:
        assert torch.equal(d.cpu(), c), (d.cpu() - c).abs().max()
    else:
        torch.testing.assert_close(d.cpu(), c)


# NOTE: LAPACK's gelsy on a rank-deficient matrix is not reproducible even on the CPU alone (its
# last bits follow the buffers' alignment: 162 of 200 repeated CPU calls differed here), so its
# values are compared within tolerance; the layouts, the point of these tests, exactly
BITWISE = {"gelsd": True, "gelss": True, "gelsy": False}


def same(a, b):
    if isinstance(a, type):
        assert a is b
    elif isinstance(a, torch.Tensor):
        same_tensor(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def check(op, build):
    (cbases, cres), (dbases, dres) = run_both(op, build)
    for c, d in zip(cbases, dbases):  # every byte of every base, read or written
        assert torch.equal(d.cpu(), c) or torch.equal(d.cpu().nan_to_num(), c.nan_to_num())
    same(cres, dres)


# -- fused optimizers: each argument list's tensors in every layout ----------------------
FUSED = {
    "_fused_adamw_": (
        aten._fused_adamw_.default,
        4,
        dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False),
    ),
    "_fused_adam_": (
        aten._fused_adam_.default,
        4,
        dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False),
    ),
    "_fused_adagrad_": (
        aten._fused_adagrad_.default,
        3,
        dict(lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10, maximize=False),
    ),
    "_fused_sgd_": (
        aten._fused_sgd_.default,
        2,
        dict(weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False, maximize=False, is_first_step=True),
    ),
}


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("where", ["param", "grad"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fused_optimizer_over_layouts(name, where, layout):
    op, lists, kw = FUSED[name]
    size, make = LAYOUTS[layout]

    def build(side):
        bases, tensors = [], []
        for k in range(lists):
            picked = (k == 0 and where == "param") or (k == 1 and where == "grad")
            b, t = pair(size if picked else 48, make if picked else LAYOUTS["contiguous"][1], seed=k)[side]
            bases.append(b)
            tensors.append([t])
        steps = [torch.tensor(3.0).to("cpu" if side == 0 else DEV)]
        if name == "_fused_sgd_":
            return bases, (*tensors, []), dict(kw)  # no momentum buffers
        if name == "_fused_adagrad_":
            return bases, (*tensors, steps), dict(kw)
        return bases, (*tensors, [], steps), dict(kw)

    check(op, build)


@pytest.mark.parametrize("name", ["_fused_adamw_", "_fused_sgd_"])
def test_fused_optimizer_with_a_tensor_twice(name):
    op, lists, kw = FUSED[name]

    def build(side):
        bases, tensors = [], []
        for k in range(lists):
            b, t = pair(48, LAYOUTS["contiguous"][1], seed=k)[side]
            bases.append(b)
            tensors.append([t, t])  # the same parameter listed twice: eager updates it twice
        steps = [torch.tensor(3.0).to("cpu" if side == 0 else DEV)] * 2
        if name == "_fused_sgd_":
            return bases, (*tensors, []), dict(kw)
        return bases, (*tensors, [], steps), dict(kw)

    check(op, build)


# -- pointwise, foreach, reductions and out= over every pair of layouts --------------------
@pytest.mark.parametrize("a,b", list(itertools.product(sorted(LAYOUTS), repeat=2)))
def test_binary_out_of_place_and_foreach(a, b):
    def build(side):
        (ba, x), (bb, y) = pair(*LAYOUTS[a], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], (x, y), {}

    check(aten.atan2.default, build)

    def build_foreach(side):
        (ba, x), (bb, y) = pair(*LAYOUTS[a], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], ([x, y, x], [y, x, y]), {}

    check(aten._foreach_mul.List, build_foreach)


@pytest.mark.parametrize("a,b", list(itertools.product(sorted(LAYOUTS), WRITABLE)))
def test_in_place_and_out_into_odd_layouts(a, b):
    def build(side):  # b written in place from a: eager's overlap errors where they share memory
        (ba, x), (bb, y) = pair(*LAYOUTS[a], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], (y, x), {}

    check(aten.mul_.Tensor, build)

    def build_out(side):
        (ba, x), (bb, o) = pair(*LAYOUTS[a], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], (x, x), {"out": o}

    check(aten.hypot.out, build_out)

    def build_foreach(side):  # the same tensor twice in the written list
        (ba, x), (bb, y) = pair(*LAYOUTS[a], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], ([y, y], [x, x]), {}

    check(aten._foreach_add_.List, build_foreach)


@pytest.mark.parametrize("b", sorted(set(LAYOUTS) - set(WRITABLE)))
def test_in_place_into_a_self_that_overlaps_itself(b):
    """Eager refuses a stride-0 self (its elements share memory) and writes an overlapping one
    in its kernel's order: the tier gives the same error, or the same bytes."""

    def build(side):
        (ba, x), (bb, y) = pair(*LAYOUTS["contiguous"], seed=1)[side], pair(*LAYOUTS[b], seed=2)[side]
        return [ba, bb], (y, x), {}

    check(aten.mul_.Tensor, build)


@pytest.mark.parametrize("b", WRITABLE)
@pytest.mark.parametrize("rows", [6, 3, 12, 0])
def test_out_resized_by_the_kernel(b, rows):
    """An out= in every layout given a result of its size, smaller (resized within its storage)
    and larger (its storage grown): sizes, strides, offset, storage size and every byte of the
    base as eager has them."""

    def build(side):
        bo, o = pair(*LAYOUTS[b], seed=2)[side]
        x = torch.arange(rows * 8.0).view(8, rows).t()
        return [bo], (x.to("cpu" if side == 0 else DEV), 1), {"out": o}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's "an output was resized" warning, on both sides
        (cb, cres), (db, dres) = run_both(aten.cumsum.out, build)
    same(cres, dres)
    same(cb, db)
    if isinstance(cres, torch.Tensor):
        assert dres.storage_offset() == cres.storage_offset()
        assert dres.untyped_storage().nbytes() == cres.untyped_storage().nbytes()


A_RANK1 = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0], [4.0, 8.0]])
B_RANK1 = torch.arange(12.0).view(4, 3)


@pytest.mark.parametrize("driver", ["gelsd", "gelsy", "gelss"])
def test_out_restrided_past_its_size(driver):
    """A rank-deficient lstsq's CPU kernel leaves its solution a (2, 3) view with strides (1, 4)
    of a larger buffer: the device out's storage must hold that layout."""

    def build(side):
        where = "cpu" if side == 0 else DEV
        outs = dict(solution=torch.empty(0), residuals=torch.empty(0), rank=torch.empty(0, dtype=torch.long))
        outs["singular_values"] = torch.empty(0)
        outs = {k: v.to(where) for k, v in outs.items()}
        return list(outs.values()), (A_RANK1.to(where), B_RANK1.to(where)), dict(driver=driver, **outs)

    (cb, cres), (db, dres) = run_both(aten.linalg_lstsq.out, build)
    for c, d in zip([*cres, *cb], [*dres, *db]):
        same_tensor(c, d, BITWISE[driver])


# -- through the switch: autograd above the tier -------------------------------------------
@pytest.fixture
def tier():
    device_switch.disable(DEV)
    yield device_switch.enable(DEV, on_unsupported="cpu")
    device_switch.disable(DEV)


def test_fused_step_bumps_versions_as_eager(tier):
    """A fused step writes its parameters below autograd, where eager bumps no version counter:
    a graph that saved the weight still runs backward, on edref as on the CPU."""
    got = []
    for where in ("cpu", DEV):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4, 4).to(where))
        loss = (w * w).sum()  # saves w
        w.grad = torch.ones_like(w)
        opt = torch.optim.AdamW([w], fused=True)
        v = w._version
        opt.step()
        loss.backward()  # raises "modified by an inplace operation" if the step bumped w
        got.append((w._version - v, w.detach().cpu()))
    assert got[0][0] == got[1][0]
    assert torch.equal(got[0][1], got[1][1])


def test_fused_step_with_a_tensor_twice_bumps_as_eager(tier):
    got = []
    for where in ("cpu", DEV):
        p, g, ea, es = (torch.ones(4, 4).to(where) for _ in range(4))
        before = [t._version for t in (p, g, ea, es)]
        steps = [torch.tensor(1.0).to(where)] * 2
        kw = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        torch._fused_adamw_([p, p], [g, g], [ea, ea], [es, es], [], steps, **kw)
        got.append(([t._version - v for t, v in zip((p, g, ea, es), before)], p.cpu(), ea.cpu()))
    assert got[0][0] == got[1][0]
    assert torch.equal(got[0][1], got[1][1]) and torch.equal(got[0][2], got[1][2])


def test_fused_step_on_inference_mode_parameters(tier):
    """Eager writes inference tensors below autograd without a version counter to bump."""
    got = []
    for where in ("cpu", DEV):
        with torch.inference_mode():
            p, g = torch.arange(16.0).view(4, 4).to(where), torch.ones(4, 4).to(where)
            ea, es = torch.zeros(4, 4).to(where), torch.zeros(4, 4).to(where)
            steps = [torch.tensor(1.0).to(where)]
        kw = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        torch._fused_adamw_([p], [g], [ea], [es], [], steps, **kw)
        got.append((p.cpu(), ea.cpu(), es.cpu()))
    for c, d in zip(*got):
        assert torch.equal(c, d)


def test_expanded_parameter_through_the_switch(tier):
    """The issue's reproduction: an expanded parameter writes inside its base, as on the CPU."""
    got = []
    for where in ("cpu", DEV):
        torch.manual_seed(0)
        base = torch.randn(6, 8).to(where)
        p = base[:1].expand(6, 8)
        g, ea, es = (torch.ones(6, 8).to(where) for _ in range(3))
        torch._fused_adamw_(
            [p],
            [g],
            [ea],
            [es],
            [],
            [torch.tensor(1.0).to(where)],
            lr=0.1,
            beta1=0.9,
            beta2=0.99,
            weight_decay=0.0,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
        got.append([base.cpu(), ea.cpu(), es.cpu()])
    for c, d in zip(*got):
        assert torch.equal(c, d)


@pytest.mark.parametrize("driver", ["gelsd", "gelsy", "gelss"])
def test_rank_deficient_lstsq_through_the_switch(tier, driver):
    c = torch.linalg.lstsq(A_RANK1, B_RANK1, driver=driver)
    d = torch.linalg.lstsq(A_RANK1.to(DEV), B_RANK1.to(DEV), driver=driver)
    for x, y in zip(c, d):
        same_tensor(x, y, BITWISE[driver])
