"""The suite's one comparison against native eager.

A test runs an op natively and under :class:`~eagerdecomp.EagerDecompMode`, with the independent
witness (:class:`~eagerdecomp.testing.RecordingMode`, entered outside the mode) checking that only
opset ops reached the kernels, and compares everything eager guarantees, leaf by leaf:

* the output structure, and each leaf's type;
* per tensor: dtype, shape, device, layout, strides, storage offset;
* aliasing: which inputs each output *is*, and which it shares storage with;
* values: ``exact`` (NaN where eager has NaN, the sign of zero, every other value bitwise), or,
  where a chain of core ops may round differently from a fused kernel, the dtype's tolerance
  (those of the conformance harness, ``tests/conformance/harness.py``) and, past it, the accuracy
  rule: no further from a float64 run than twice eager's own error plus that tolerance.

The tolerance is always the dtype's actually compared: a float32 result is never held to
bfloat16's.
"""

from __future__ import annotations

import copy
import math
import re

import torch
from torch.utils._pytree import tree_flatten, tree_map

import eagerdecomp as ed
from eagerdecomp.demo import train_step
from eagerdecomp.testing import RecordingMode
from tests.conformance.harness import _TOL, _aliases, _as_accurate, copy_args

__all__ = [
    "tolerance",
    "assert_values",
    "assert_like_eager",
    "check_against_eager",
    "float64_run",
    "assert_raises_like_eager",
    "train_like_eager",
    "assert_params_close",
]


def tolerance(dtype: torch.dtype) -> tuple:
    """``(rtol, atol)`` of ``dtype`` (torch.testing's defaults, as the conformance harness)."""
    return _TOL[dtype]


def _tensors(tree) -> list:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _exact(w, g, what):
    if w.dtype == torch.complex32:  # no kernels to compare ComplexHalf with: the upcast is exact
        w, g = w.to(torch.complex64), g.to(torch.complex64)
    if w.is_complex():
        w, g = torch.view_as_real(w.resolve_conj()), torch.view_as_real(g.resolve_conj())
    if w.is_floating_point():
        assert torch.equal(w.isnan(), g.isnan()), f"{what}: NaN where eager has none (or the reverse)"
        w, g = w.nan_to_num(), g.nan_to_num()
        zeros = w == 0
        assert torch.equal(w.signbit()[zeros], g.signbit()[zeros]), f"{what}: the sign of a zero differs"
    if not torch.equal(w, g):
        at = tuple((w != g).nonzero()[0].tolist())
        raise AssertionError(f"{what}: values differ (exact) first at {at}: eager {w[at]}, mode {g[at]}")


def assert_values(want, got, *, exact=True, ref=None, what="output") -> None:
    """``got``'s values are eager's ``want``: exactly, or within ``want.dtype``'s tolerance, or
    (reduced-precision floats, ``ref`` a float64 run of the same call) no further from ``ref``
    than twice eager's own error plus that tolerance."""
    if not want.numel():
        return
    if exact or want.dtype not in _TOL:
        _exact(want.detach(), got.detach(), what)
        return
    rtol, atol = tolerance(want.dtype)
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
    except AssertionError as e:
        if ref is None or want.dtype in (torch.float64, torch.complex128):
            raise AssertionError(f"{what}: {want.dtype} values differ: {e}") from None
        want, got = want.detach(), got.detach()
        differ = ~((got == want) | (got.isnan() & want.isnan()))  # an equal infinity is no error
        assert _as_accurate(want[differ], got[differ], ref.detach()[differ], rtol, atol), (
            f"{what}: {want.dtype} values further from float64 than twice eager's error plus rtol={rtol}, atol={atol}"
        )


def assert_like_eager(want, got, *, exact=True, ref=None, inputs=None, strides=True) -> None:
    """``got`` (the mode's result) is eager's ``want``; see the module docstring.

    ``ref``: the same call in float64 (a tree like ``want``), for the accuracy rule; ``inputs``:
    ``(eager's inputs, the mode's inputs)``, or one list both runs were called on, to compare
    aliasing; ``strides=False`` where eager's strides are not a promise (a 0/1-element tensor).
    """
    wflat, wspec = tree_flatten(want)
    gflat, gspec = tree_flatten(got)
    assert str(wspec) == str(gspec), f"output structure: eager {wspec}, mode {gspec}"
    rflat = tree_flatten(ref)[0] if ref is not None else [None] * len(wflat)
    if inputs is not None and not isinstance(inputs, tuple):
        inputs = (inputs, inputs)
    for i, (w, g) in enumerate(zip(wflat, gflat)):
        what = f"output {i}"
        assert type(w) is type(g), f"{what}: eager {type(w).__name__}, mode {type(g).__name__}"
        if not isinstance(w, torch.Tensor):
            same = w == g or (isinstance(w, float) and math.isnan(w) and math.isnan(g))
            assert same, f"{what}: eager {w!r}, mode {g!r}"
            continue
        meta = lambda t: (t.dtype, tuple(t.shape), t.device, t.layout)  # noqa: E731
        assert meta(w) == meta(g), f"{what}: eager {meta(w)}, mode {meta(g)}"
        if w.layout == torch.strided:
            if strides:
                assert w.stride() == g.stride(), f"{what}: strides eager {w.stride()}, mode {g.stride()}"
            assert w.storage_offset() == g.storage_offset(), (
                f"{what}: storage offset eager {w.storage_offset()}, mode {g.storage_offset()}"
            )
            if inputs is not None:
                wa, ga = _aliases(w, inputs[0]), _aliases(g, inputs[1])
                assert wa == ga, f"{what}: (is input, shares storage with input) eager {wa}, mode {ga}"
        else:
            w, g = w.to_dense(), g.to_dense()
        r = rflat[i] if i < len(rflat) else None
        assert_values(
            w, g, exact=exact, ref=r if isinstance(r, torch.Tensor) and r.shape == w.shape else None, what=what
        )


def float64_run(fn, *args, **kwargs):
    """``fn`` natively on float64 copies of its reduced-precision float arguments."""

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16, torch.float32):
            return x.detach().to(torch.float64)
        return x

    return fn(*tree_map(up, list(args)), **tree_map(up, kwargs))


def check_against_eager(fn, *args, opset="core_aten", exact=True, witness=True, **kwargs):
    """Call ``fn(*args, **kwargs)`` natively and under ``EagerDecompMode(opset)`` (each on its own
    copy of the arguments, storage sharing between them kept), with the witness checking that
    only ``opset`` ops reached the kernels, and compare as :func:`assert_like_eager`, inputs
    after the call included (in-place writes). ``exact=False``: the dtype's tolerance, and past
    it the accuracy rule against a float64 run. Returns ``(eager's, the mode's)`` results."""
    nat, ours = copy_args((list(args), kwargs)), copy_args((list(args), kwargs))
    want = fn(*nat[0], **nat[1])
    with RecordingMode() as rec, ed.EagerDecompMode(opset):
        got = fn(*ours[0], **ours[1])
    if witness:
        rec.assert_only(opset)
    ref = None
    if not exact and any(t.dtype in (torch.float16, torch.bfloat16, torch.float32) for t in _tensors(want)):
        ref = float64_run(fn, *args, **kwargs)
    assert_like_eager(want, got, exact=exact, ref=ref, inputs=(_tensors(nat), _tensors(ours)))
    assert_like_eager(_tensors(nat), _tensors(ours), exact=exact)  # the inputs afterwards
    return want, got


def assert_raises_like_eager(fn, *args, opset="core_aten", message="class", **kwargs):
    """``fn`` raises natively, and under the mode raises eager's very exception type (never an
    :class:`~eagerdecomp.EagerDecompError`, which subclasses RuntimeError and so would pass an
    ``isinstance`` check meant for eager's). ``message``: ``"class"``, eager's message up to how
    numbers are written (``1`` or ``1.0``); True, eager's message exactly; a regular expression
    both messages match; None, the type alone. Returns ``(eager's exception, the mode's)``."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - eager's, whatever it is
        eager_e = e
    else:
        raise AssertionError("eager does not raise: nothing to compare")
    try:
        with ed.EagerDecompMode(opset):
            fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - compared below
        ours = e
    else:
        raise AssertionError(f"eager raises {type(eager_e).__name__}: {eager_e}; the mode returns a result")
    assert not isinstance(ours, ed.EagerDecompError), (
        f"eagerdecomp's {type(ours).__name__} where eager raises {type(eager_e).__name__}: {ours}"
    )
    assert type(ours) is type(eager_e), f"the mode raises {type(ours).__name__}, eager {type(eager_e).__name__}"
    if message == "class":
        number = r"-?(?:inf|nan|\d+(?:\.\d*)?(?:e[-+]?\d+)?)"
        assert re.sub(number, "#", str(ours)) == re.sub(number, "#", str(eager_e)), (
            f"the mode says {ours}, eager {eager_e}"
        )
    elif message is True:
        assert str(ours) == str(eager_e), f"the mode says {ours}, eager {eager_e}"
    elif message is not None:
        assert re.search(message, str(eager_e)) and re.search(message, str(ours)), (message, str(eager_e), str(ours))
    return eager_e, ours


def train_like_eager(model_cls, opset="core_aten", steps=2, witness=True):
    """``steps`` training steps (forward, cross-entropy, backward, AdamW) of ``model_cls()``
    natively and under ``EagerDecompMode(opset)`` from identical states: logits, losses and
    gradients match at float32 rounding of decomposed chains each step, and (``witness``) only
    ``opset`` ops reach the kernels. Returns ``(native model, ours, the last mode, last native
    gradients, the last witness)``; parameters are compared by the caller (see
    :func:`assert_params_close`)."""
    torch.manual_seed(0)
    native = model_cls()
    ours = copy.deepcopy(native)
    opt_n = torch.optim.AdamW(native.parameters(), lr=1e-2)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    x, y = model_cls.batch()
    for _ in range(steps):
        ln, lossn, gn = train_step(native, opt_n, x, y)
        with RecordingMode() as rec, ed.EagerDecompMode(opset) as mode:
            lo, losso, go = train_step(ours, opt_o, x, y)
        if witness:
            rec.assert_only(opset)
        torch.testing.assert_close(lo, ln, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(losso, lossn, rtol=1e-4, atol=1e-5)
        for a, b in zip(go, gn):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    return native, ours, mode, gn, rec


def assert_params_close(native, ours, grads) -> None:
    """Parameters after the optimizer step match where the gradient carries signal.

    NOTE: some gradients are zero in exact arithmetic (attention's key bias, a bias before batch
    norm) and rounding noise of order 1e-9 in both runs; Adam divides by sqrt(v) and turns any
    such noise into a full +-lr step.
    """
    for p, q, g in zip(native.parameters(), ours.parameters(), grads):
        signal = g.abs() > 1e-4 * g.abs().max().clamp_min(1e-30)
        torch.testing.assert_close(q[signal], p[signal], rtol=1e-3, atol=1e-5)
