"""Run one OpInfo sample natively and under ``EagerDecompMode``, and classify the outcome.

Every sample is run twice on independent copies of its inputs (same strides,
storage offsets and aliasing between arguments): once natively and once under
``EagerDecompMode(OPSET)`` (``core_aten``; ``EAGERDECOMP_CONFORMANCE_OPSET`` or
:func:`target` names another preset) with a :class:`RecordingMode` entered outside
it, the independent witness of which ops reached the kernels (only ``OPSET``'s may). The two runs are
then compared on everything eager guarantees: output structure, dtypes,
shapes, values, significant strides, storage offsets of views, which inputs
each output aliases (and whether it *is* an input object), and the state of
every input afterwards (in-place and out= writes). For float64 samples of
differentiable ops the gradients, computed through the mode, are compared too.

``EAGERDECOMP_CONFORMANCE_COMPILE=inductor`` (or :func:`compiled`) runs the mode
with ``compile=``: each sample is first run on copies until its kernels are
compiled, so the compared call is answered by the compiled code (values judged
against float64 as for any approximation; everything else exactly).

Classes (:data:`CLASSES`):

``pass``            decomposed (or bypassed) and eager-exact;
``pass-native``     exact, and every op that reached the mode was already in the opset;
``unsupported``     the op has no path to the opset (``blocker`` names the op);
``wrong``           a silently different answer (or an op outside the opset leaked below the mode);
``error``           any other exception, a hang, or a RecursionError.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import signal
from dataclasses import dataclass, field

import torch
from torch._prims_common import check_significant_strides
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_map

import eagerdecomp as ed
from eagerdecomp.errors import UnsupportedOpError
from eagerdecomp.testing import RecordingMode
from tests.distributions import ALPHA, same_distribution

__all__ = ["CLASSES", "OPSET", "Outcome", "run_sample", "reports_dir", "target", "VARIANTS", "SampleTimeout"]

CLASSES = ("pass", "pass-native", "unsupported", "wrong", "error")
# fn: the functional call; inplace / out: the OpInfo's in-place and out= variants;
# grad: gradients of the functional call (float64, differentiable ops only)
VARIANTS = ("fn", "inplace", "out", "grad")

# the target opset, a preset name: EAGERDECOMP_CONFORMANCE_OPSET (make conformance OPSET=prims_fusion);
# the witness checks against the same opset, and reports_dir keeps each opset's reports apart
OPSET = os.environ.get("EAGERDECOMP_CONFORMANCE_OPSET") or "core_aten"
if OPSET not in ed.PRESETS:
    raise ValueError(f"EAGERDECOMP_CONFORMANCE_OPSET={OPSET!r}: expected one of {sorted(ed.PRESETS)}")


def reports_dir(root: str) -> str:
    """Where this opset's reports go: ``root`` itself for core ATen (its reports stay where they
    always were), ``root/OPSET/`` for another preset (summary and shards), so no run overwrites
    another opset's."""
    return root if OPSET == "core_aten" else os.path.join(root, OPSET)


# None, or the mode's compile= (then every sample warms up until its kernels are compiled)
COMPILE = os.environ.get("EAGERDECOMP_CONFORMANCE_COMPILE") or None
SEED = 1234
# a sample that runs longer than this under the mode is a hang, not a slow pass
SAMPLE_TIMEOUT_S = 120

# Default tolerances (those of torch.testing.assert_close), and the floor under which a
# difference is noise even when the native kernel happens to be closer to float64.
_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    # complex results are transforms (fft.py): rounded like the float parts they are made of
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

# NOTE: an op whose eager kernel works in tiles (the CPU flash-attention kernel: blocked GEMMs
# and an online softmax) rounds otherwise than any composition of whole-tensor ops, and no core
# op reproduces its tiling. Such an op is judged at the tolerance its own OpInfo declares for
# TestCommon, where PyTorch compares the op's implementations (read from the OpInfo, never
# retyped; a dtype it names no tolerance for keeps the default).
TILED_KERNELS = frozenset({"nn.functional.scaled_dot_product_attention"})
_DECLARED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("declared_tolerance", default=None)


def declared_tolerance(opinfo) -> dict:
    """``{dtype: (rtol, atol)}`` the OpInfo's TestCommon ``toleranceOverride`` allows, for an op in
    :data:`TILED_KERNELS`; otherwise ``{}``."""
    if opinfo.name not in TILED_KERNELS:
        return {}
    return {
        dtype: (t.rtol, t.atol)
        for info in opinfo.decorators
        if getattr(info, "cls_name", None) == "TestCommon" and getattr(info, "test_name", None) is None
        for dec in info.decorators
        for dtype, t in getattr(dec, "d", {}).items()
    }


def _tolerance(dtype) -> tuple:
    rtol, atol = _TOL[dtype]
    wide_rtol, wide_atol = (_DECLARED.get() or {}).get(dtype, (0.0, 0.0))
    return max(rtol, wide_rtol), max(atol, wide_atol)


@dataclass
class Outcome:
    """What happened to one sample in one variant."""

    cls: str
    variant: str
    detail: str = ""
    blocker: str | None = None
    random: bool = False  # the op draws random numbers
    stream_differs: bool = False  # ...and not the same ones as the native kernel
    notes: list = field(default_factory=list)


class SampleTimeout(Exception):
    pass


class Mismatch(Exception):
    """The mode's answer differs from eager's: the sample is ``wrong``."""

    def __init__(self, message, values: bool = False):
        super().__init__(message)
        self.values = values  # only the values differ (dtypes, shapes, strides, aliasing agree)


# -- copies of a sample's arguments -----------------------------------------------------


def _is_plain(t) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided


def copy_args(tree, requires_grad: bool | None = None):
    """Deep copy with the same sizes, strides, offsets and storage sharing between tensors.

    ``requires_grad=None`` keeps each tensor's flag; a bool sets it on every
    floating tensor (copies are leaves).
    """
    storages: dict = {}

    def copy(x):
        if not isinstance(x, torch.Tensor):
            return x
        if not _is_plain(x):
            return x.detach().clone()
        with torch.no_grad():
            ref = StorageWeakRef(x.untyped_storage())
            s = storages.get(ref)
            if s is None:
                s = storages[ref] = x.untyped_storage().clone()
            new = torch.empty(0, dtype=x.dtype, device=x.device)
            new.set_(s, x.storage_offset(), x.shape, x.stride())
        want = x.requires_grad if requires_grad is None else requires_grad
        if want and (x.dtype.is_floating_point or x.dtype.is_complex):
            new.requires_grad_()
        return new

    return tree_map(copy, tree)


def _tensors(tree) -> list:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _storage(t):
    return StorageWeakRef(t.untyped_storage()) if _is_plain(t) else None


# -- running ----------------------------------------------------------------------------


class _Timer:
    """Raise :class:`SampleTimeout` in this thread after ``seconds`` (SIGALRM; main thread only)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _fire(self, *_):
        raise SampleTimeout(f"no answer within {self.seconds}s")

    def __enter__(self):
        try:
            self.old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        except ValueError:  # not the main thread
            self.old = None
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def _call(fn, args):
    inp, a, kw = args
    return fn(inp, *a, **kw)


def _run_native(fn, args):
    torch.manual_seed(SEED)
    with RecordingMode() as rec:
        out = _call(fn, args)
    return out, rec


@contextlib.contextmanager
def compiled(compile="inductor"):
    """Within it, samples run under ``EagerDecompMode(OPSET, compile=compile)``, compiled
    on their first replay whatever their size (so small OpInfo samples compile too)."""
    import eagerdecomp.runtime.compiler as c

    global COMPILE
    saved = COMPILE, c.AFTER, c.MIN_NUMEL
    COMPILE, c.AFTER, c.MIN_NUMEL = compile, 0, 0
    try:
        yield
    finally:
        COMPILE, c.AFTER, c.MIN_NUMEL = saved


@contextlib.contextmanager
def target(opset: str):
    """Within it, samples run under ``EagerDecompMode(opset)`` and the witness checks against
    ``opset`` (what ``EAGERDECOMP_CONFORMANCE_OPSET`` sets for a whole run)."""
    global OPSET
    if opset not in ed.PRESETS:
        raise ValueError(f"{opset!r} is not a preset: {sorted(ed.PRESETS)}")
    saved, OPSET = OPSET, opset
    try:
        yield
    finally:
        OPSET = saved


def _mode():
    return ed.EagerDecompMode(OPSET, compile=COMPILE)


if COMPILE is not None:  # the environment asked for a compiled run: every size compiles on its first replay
    import eagerdecomp.runtime.compiler as _compiled

    _compiled.AFTER, _compiled.MIN_NUMEL = 0, 0


def _warm(call, args):
    """Under compile=: run on copies until the call's kernels are compiled (trace, then a
    replay that compiles), so the compared call runs the compiled code."""
    if COMPILE is None:
        return
    import eagerdecomp.runtime.compiler as c

    for _ in range(c.AFTER + 2):
        copies = copy_args(args)  # outside the mode: copying is not the op under test
        try:
            torch.manual_seed(SEED)
            with _mode():
                call(copies)
        except Exception:  # noqa: BLE001 - the compared call meets the same error, and classifies it
            return


def _run_mode(fn, args):
    """``(output, mode, recorder)``; exceptions propagate."""
    _warm(lambda a: _call(fn, a), args)
    torch.manual_seed(SEED)
    with RecordingMode() as rec, _mode() as mode:
        out = _call(fn, args)
    return out, mode, rec


def _is_random(rec) -> bool:
    return any(torch.Tag.nondeterministic_seeded in op.tags for op in rec.ops if hasattr(op, "tags"))


# -- comparing --------------------------------------------------------------------------


def _close(native, got, what: str, ref=None) -> None:
    """Values equal within the dtype's default tolerance, or, for reduced-precision floats,
    no further from a float64 run (``ref``) than twice native's own error plus that tolerance.

    NOTE: a decomposition rounds at each core op where a fused native kernel rounds once
    (linalg.cross in bfloat16 differs by 0.06 on a cancelling element); judging both
    against float64, as PyTorch's own decomposition tests do, separates rounding from bugs.
    """
    if native.dtype in _TOL and native.numel():
        rtol, atol = _tolerance(native.dtype)
        try:
            torch.testing.assert_close(got, native, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
            return
        except AssertionError as e:
            if ref is None or native.dtype in _WIDE or not _as_accurate(native, got, ref, rtol, atol):
                raise Mismatch(f"{what}: values differ: {_first_line(e)}", values=True) from None
            return
    if native.dtype == torch.complex32:  # nan_to_num has no ComplexHalf kernel; the upcast is exact
        native, got = native.to(torch.complex64), got.to(torch.complex64)
    if native.numel() and not torch.equal(torch.nan_to_num(got), torch.nan_to_num(native)):
        raise Mismatch(f"{what}: values differ ({native.dtype} must be exact)", values=True)


_WIDE = (torch.float64, torch.complex128)


def _as_accurate(native, got, ref, rtol, atol) -> bool:
    wide = torch.complex128 if native.dtype.is_complex else torch.float64
    ref = ref.detach().to(wide)
    err_native = (native.to(wide) - ref).abs().nan_to_num(0.0)
    err_got = (got.to(wide) - ref).abs()
    # equal values need no reference: an infinity in both (a masked log_softmax's -inf) has an
    # error of nan against the reference's
    same = (got.to(wide) == native.to(wide)) | (got.isnan() & native.isnan())
    ok = (err_got <= 2 * err_native + atol + rtol * ref.abs()) | same
    return bool(ok.all())


def _first_line(e) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(lines[:3])


def _aliases(out, inputs) -> tuple:
    s = _storage(out)
    same = tuple(i for i, x in enumerate(inputs) if out is x)
    shared = tuple(
        i for i, x in enumerate(inputs) if s is not None and _storage(x) == s and x.untyped_storage().nbytes()
    )
    return same, shared


def compare_outputs(native, got, nat_inputs, got_inputs, values: bool = True, ref=None) -> None:
    """Raise :class:`Mismatch` naming the first difference between the two runs.

    ``ref``: the same call's outputs in float64, to judge reduced-precision rounding.
    """
    nflat, nspec = tree_flatten(native)
    gflat, gspec = tree_flatten(got)
    rflat = tree_flatten(ref)[0] if ref is not None else [None] * len(nflat)
    if len(nflat) != len(gflat) or str(nspec) != str(gspec):
        raise Mismatch(f"output structure: eager {nspec}, mode {gspec}")
    for i, (n, g) in enumerate(zip(nflat, gflat)):
        what = f"output {i}"
        if isinstance(n, torch.Tensor) != isinstance(g, torch.Tensor):
            raise Mismatch(f"{what}: eager {type(n).__name__}, mode {type(g).__name__}")
        if not isinstance(n, torch.Tensor):
            if type(n) is not type(g) or not _scalar_equal(n, g, values):
                raise Mismatch(f"{what}: eager {n!r}, mode {g!r}")
            continue
        _compare_tensor(n, g, what, values, rflat[i] if i < len(rflat) else None)
        if _is_plain(n) and _aliases(n, nat_inputs) != _aliases(g, got_inputs):
            raise Mismatch(
                f"{what}: aliasing (is input, shares storage with input) eager {_aliases(n, nat_inputs)}, "
                f"mode {_aliases(g, got_inputs)}"
            )
        if _is_plain(n) and _aliases(n, nat_inputs)[1] and n.storage_offset() != g.storage_offset():
            raise Mismatch(f"{what}: view storage offset eager {n.storage_offset()}, mode {g.storage_offset()}")


def _scalar_equal(n, g, values) -> bool:
    if not values:
        return True
    if isinstance(n, float):
        return (math.isnan(n) and math.isnan(g)) or math.isclose(n, g, rel_tol=1e-6, abs_tol=1e-6)
    return n == g


def _compare_tensor(n, g, what, values: bool, ref=None) -> None:
    if (n.dtype, tuple(n.shape), n.device, n.layout) != (g.dtype, tuple(g.shape), g.device, g.layout):
        raise Mismatch(
            f"{what}: eager {n.dtype}{list(n.shape)} {n.layout} on {n.device}, "
            f"mode {g.dtype}{list(g.shape)} {g.layout} on {g.device}"
        )
    if n.layout != torch.strided:
        n, g = n.to_dense(), g.to_dense()
    elif n.numel() > 1 and not check_significant_strides(n, g, only_cuda=False)[0]:
        raise Mismatch(f"{what}: strides eager {n.stride()}, mode {g.stride()} (shape {list(n.shape)})")
    if values:
        _close(n.detach(), g.detach(), what, ref if isinstance(ref, torch.Tensor) and ref.shape == n.shape else None)


def compare_inputs(nat_inputs, got_inputs, refs=None, values: bool = True) -> None:
    """After the call, every input holds the same values and metadata in both runs.

    Strides are compared where they are significant: a 0- or 1-element tensor's
    strides are not (eager's nonzero(out=) leaves (1, 0) on a [0, 0] result).
    """
    refs = refs or [None] * len(nat_inputs)
    for i, (n, g) in enumerate(zip(nat_inputs, got_inputs)):
        what = f"input {i} after the call"
        if tuple(n.shape) != tuple(g.shape) or (
            _is_plain(n) and n.numel() > 1 and not check_significant_strides(n, g, only_cuda=False)[0]
        ):
            raise Mismatch(f"{what}: eager {list(n.shape)}/{n.stride()}, mode {list(g.shape)}/{g.stride()}")
        if _is_plain(n) and n.numel() and n.storage_offset() != g.storage_offset():
            raise Mismatch(f"{what}: storage offset eager {n.storage_offset()}, mode {g.storage_offset()}")
        _compare_tensor(n, g, what, values=values, ref=refs[i])


# -- one sample, one variant ------------------------------------------------------------


def _classify_exception(e, variant) -> Outcome:
    if isinstance(e, UnsupportedOpError):
        blocker = str(e.chain[-1]) if e.chain else str(e.op)
        return Outcome("unsupported", variant, f"{e.reason}: {' -> '.join(map(str, e.chain))}", blocker=blocker)
    return Outcome("error", variant, f"{type(e).__name__}: {_first_line(e)[:300]}")


def _both_raise(native_error, e, variant) -> Outcome:
    """Eager rejects the call: the mode must reject it as eager does, with eager's very exception
    type. NOTE: an EagerDecompError is a RuntimeError, so an isinstance check would take our own
    decline (or a TraceError) for eager's rejection: ours is classified as ours."""
    if isinstance(e, ed.EagerDecompError):
        return _classify_exception(e, variant)
    if type(e) is not type(native_error):
        return Outcome(
            "wrong",
            variant,
            f"eager raises {type(native_error).__name__}: {_first_line(native_error)[:150]}; "
            f"the mode raises {type(e).__name__}: {_first_line(e)[:150]}",
        )
    return Outcome("pass", variant, "eager and the mode both raise", notes=["both-raise"])


def _passed(mode, variant, **kw) -> Outcome:
    rows = mode.report().rows
    native_only = all(r.route == "passthrough" for r in rows)
    out = Outcome("pass-native" if native_only else "pass", variant, **kw)
    if any(r.compiled for r in rows):
        out.notes.append("compiled")
    return out


def _leaked(rec) -> str | None:
    bad = rec.outside(OPSET)
    return f"ops outside {OPSET} reached the kernels: {bad}" if bad else None


def run_variant(fn, sample_args, variant, make_out=None, values: bool = True) -> Outcome:
    """Run ``fn`` on copies of ``sample_args`` natively and under the mode, and compare.

    ``values=False`` compares everything but values (ops returning uninitialized memory).
    """
    nat_args, got_args = copy_args(sample_args), copy_args(sample_args)
    if make_out is not None:
        nat_args[2]["out"], got_args[2]["out"] = make_out(), make_out()
    nat_in, got_in = _tensors(nat_args), _tensors(got_args)
    try:
        native, rec_native = _run_native(fn, nat_args)
    except Exception as e:  # noqa: BLE001
        native_error = e
    else:
        native_error = None
    try:
        with _Timer(SAMPLE_TIMEOUT_S):
            got, mode, rec = _run_mode(fn, got_args)
    except Exception as e:  # noqa: BLE001
        if native_error is not None and not isinstance(e, SampleTimeout):
            return _both_raise(native_error, e, variant)
        return _classify_exception(e, variant)
    if native_error is not None:
        return Outcome(
            "wrong",
            variant,
            f"eager raises {type(native_error).__name__}: {_first_line(native_error)[:200]}, the mode returns a result",
        )
    leak = _leaked(rec)
    if leak:
        return Outcome("wrong", variant, leak)
    random = _is_random(rec_native)
    try:
        try:
            compare_outputs(native, got, nat_in, got_in, values=values)
            compare_inputs(nat_in, got_in, values=values)
        except Mismatch as m:
            if not m.values or (random and not _ignores_draws(fn, sample_args)):
                raise
            random = False
            ref_out, ref_in = _float64_run(fn, sample_args, make_out)
            compare_outputs(native, got, nat_in, got_in, values=values, ref=ref_out)
            compare_inputs(nat_in, got_in, ref_in, values=values)
    except Mismatch as m:
        if not random:
            return Outcome("wrong", variant, str(m))
        return _check_random(fn, sample_args, variant, native, got, nat_in, got_in, mode)
    return _passed(mode, variant, random=random)


# NOTE: these OpInfos return uninitialized memory: only metadata can be compared.
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})


def _float64_run(fn, sample_args, make_out):
    """The same call natively in float64 (reduced-precision floats upcast): ``(outputs, inputs)``."""

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16, torch.float32):
            return x.to(torch.float64)
        return x

    args = tree_map(up, copy_args(sample_args))
    if make_out is not None:
        args[2]["out"] = tree_map(up, make_out())
    try:
        torch.manual_seed(SEED)
        return _call(fn, args), _tensors(args)
    except Exception:  # noqa: BLE001 - no float64 kernel: no reference, the plain comparison stands
        return None, None


# a random sample whose stream differs is drawn this many times on each side (more calls for
# fewer values per call), for the distribution check
RANDOM_VALUES, RANDOM_CALLS = 20_000, (100, 400)


@contextlib.contextmanager
def _seeds_per_call(first: int):
    """``torch.manual_seed`` seeds ``first``, ``first + 1``, ... whatever it is asked: the
    OpInfos of random ops reseed every call (``wrapper_set_seed``), which would draw one value
    over and over. Yields the function that starts the next call's stream."""
    real, seeds = torch.manual_seed, itertools.count(first)
    torch.manual_seed = lambda _seed: real(next(seeds))
    try:
        yield lambda: torch.manual_seed(None)
    finally:
        torch.manual_seed = real


def _random_draws(fn, sample_args, seed, calls, under_mode) -> list:
    """``calls`` independent draws of the sample (fresh copies of its arguments, each call from
    seeds of its own: ``seed * 1_000_003 + i``): per output tensor, ``[calls, numel]`` values."""
    copies = [copy_args(sample_args) for _ in range(calls)]  # outside the mode: not the op under test
    outs = []
    with _seeds_per_call(seed * 1_000_003) as reseed, _mode() if under_mode else contextlib.nullcontext():
        for args in copies:
            reseed()
            outs.append(_tensors(_call(fn, args)))
    return [torch.stack([t.detach().reshape(-1) for t in column]) for column in zip(*outs)]


def _ignores_draws(fn, sample_args) -> bool:
    """Whether eager gives the same numbers from ``RANDOM_CALLS[0]`` seeds: the op is tagged
    random but ignores its draws for these arguments.

    NOTE: SDPA at ``dropout_p=0`` (or ``bernoulli`` at p in {0, 1}) is then judged by its values
    like any deterministic op: the distribution test reads a rounding difference that every call
    shares as a shifted distribution. Two calls are not enough evidence: a scalar ``bernoulli``
    at p = 0.5 repeats itself half the time; 100 do so with probability 2^-99."""
    draws = _random_draws(fn, sample_args, SEED + 3, RANDOM_CALLS[0], under_mode=False)
    return all(bool(((d == d[:1]) | (d.isnan() & d[:1].isnan())).all()) for d in draws)


def _distribution(fn, sample_args, native) -> str | None:
    """Eager's distribution, per output, from repeated calls on both sides (another seed each):
    the sign-flip test of :func:`tests.distributions.same_distribution`, its false alarms at most
    ``ALPHA`` for the sample (shared among its outputs)."""
    numel = sum(t.numel() for t in _tensors(native))
    if numel == 0:
        return None
    low, high = RANDOM_CALLS
    calls = min(high, max(low, math.ceil(RANDOM_VALUES / numel)))
    eager = _random_draws(fn, sample_args, SEED + 1, calls, under_mode=False)
    ours = _random_draws(fn, sample_args, SEED + 2, calls, under_mode=True)
    for i, (e, o) in enumerate(zip(eager, ours)):
        problem = same_distribution(e, o, alpha=ALPHA / len(eager))
        if problem:
            return f"random op, output {i} over {calls} calls: {problem}"
    return None


def _check_random(fn, sample_args, variant, native, got, nat_in, got_in, mode) -> Outcome:
    """A random op's numbers may come from another stream: check everything else.

    Same structure, dtypes, shapes, strides and aliasing; fresh numbers on each
    call wherever the native op gives fresh numbers; the same numbers after the
    same ``torch.manual_seed``; and eager's distribution (:func:`_distribution`).
    """
    try:
        compare_outputs(native, got, nat_in, got_in, values=False)
    except Mismatch as m:
        return Outcome("wrong", variant, str(m), random=True)

    def mode_draw(seed=None):
        args = copy_args(sample_args)
        if seed is not None:
            torch.manual_seed(seed)
        with _mode():
            return _tensors(_call(fn, args))

    def native_draw():
        return _tensors(_call(fn, copy_args(sample_args)))

    def same(a, b):
        return all(torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)) for x, y in zip(a, b))

    try:
        if not same(mode_draw(7), mode_draw(7)):
            return Outcome("wrong", variant, "random op: not reproducible under torch.manual_seed", random=True)
        fresh_native = not same(native_draw(), native_draw())
        if fresh_native and same(mode_draw(), mode_draw()):
            return Outcome(
                "wrong", variant, "random op: the same numbers on two calls (eager draws fresh ones)", random=True
            )
        problem = _distribution(fn, sample_args, native)
    except Exception as e:  # noqa: BLE001
        return _classify_exception(e, variant)
    if problem:
        return Outcome("wrong", variant, problem, random=True, stream_differs=True)
    return _passed(
        mode,
        variant,
        random=True,
        stream_differs=True,
        detail="random stream differs from the native kernel; eager's distribution",
    )


# -- gradients --------------------------------------------------------------------------


def _grad_weights(outs):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(o.shape, dtype=o.dtype, generator=g) if o.numel() else torch.zeros_like(o) for o in outs]


def _grads(fn, args, process):
    out = process(_call(fn, args))
    outs = [o for o in _tensors(out) if o.requires_grad]
    leaves = [t for t in _tensors(args) if t.requires_grad]
    if not outs or not leaves:
        return None, leaves
    # weights are made (outside any mode) by the caller's generator: same on both runs
    return (outs, leaves), leaves


def run_grad(fn, sample_args, process) -> Outcome | None:
    """Compare gradients of ``fn`` through the mode with native ones (None: nothing to differentiate)."""
    nat_args, got_args = copy_args(sample_args), copy_args(sample_args)
    try:
        pair, _ = _grads(fn, nat_args, process)
        if pair is None:
            return None
        outs, leaves = pair
        weights = _grad_weights(outs)
        native = torch.autograd.grad(outs, leaves, weights, allow_unused=True)
    except Exception:  # noqa: BLE001 - eager cannot differentiate this sample: nothing to compare
        return None
    try:
        with _Timer(SAMPLE_TIMEOUT_S):

            def backward(a):
                outs, leaves = _grads(fn, a, process)[0]
                torch.autograd.grad(outs, leaves, [w.detach() for w in weights], allow_unused=True)

            _warm(backward, sample_args)
            with RecordingMode() as rec, _mode() as mode:
                pair, _ = _grads(fn, got_args, process)
                outs, leaves = pair
                got = torch.autograd.grad(outs, leaves, [w.detach() for w in weights], allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return _classify_exception(e, "grad")
    leak = _leaked(rec)
    if leak:
        return Outcome("wrong", "grad", leak)
    for i, (n, g) in enumerate(zip(native, got)):
        if (n is None) != (g is None):
            return Outcome("wrong", "grad", f"gradient {i}: eager {n is not None}, mode {g is not None}")
        if n is None:
            continue
        try:
            if (n.dtype, n.shape) != (g.dtype, g.shape):
                raise Mismatch(f"gradient {i}: eager {n.dtype}{list(n.shape)}, mode {g.dtype}{list(g.shape)}")
            _close(n, g, f"gradient {i}")
        except Mismatch as m:
            return Outcome("wrong", "grad", str(m))
    return _passed(mode, "grad")


# -- one sample, every variant ----------------------------------------------------------


def out_maker(opinfo, args):
    """For an OpInfo with an out= variant whose sample runs natively: a maker of its out= tensors."""
    if not opinfo.supports_out:
        return None
    try:
        native = _call(opinfo.op, copy_args(args))
    except Exception:  # noqa: BLE001 - eager refuses the sample: no out= to make
        return None
    return _out_factory(native)


def _out_factory(native):
    """Zero-size out= tensors of the native outputs' dtypes: eager resizes them, no warning."""
    flat = native if isinstance(native, (tuple, list)) else (native,)
    if not flat or not all(isinstance(t, torch.Tensor) and _is_plain(t) for t in flat):
        return None
    dtypes = [(t.dtype, t.device) for t in flat]
    single = isinstance(native, torch.Tensor)

    def make():
        outs = tuple(torch.empty(0, dtype=d, device=dev) for d, dev in dtypes)
        return outs[0] if single else outs

    return make


def run_sample(opinfo, sample, dtype, variants=VARIANTS) -> list:
    """Every applicable variant of one sample: a list of :class:`Outcome`.

    Tensors that require grad in ``sample`` (float64 samples of differentiable
    ops) are differentiated in the ``grad`` variant; the other variants run on
    copies that do not require grad.
    """
    token = _DECLARED.set(declared_tolerance(opinfo))
    try:
        return _run_sample(opinfo, sample, dtype, variants)
    finally:
        _DECLARED.reset(token)


def _run_sample(opinfo, sample, dtype, variants) -> list:
    grad_args = (sample.input, tuple(sample.args), dict(sample.kwargs))
    args = copy_args(grad_args, requires_grad=False)
    results = []
    fn_outcome = None
    values = opinfo.name not in UNINITIALIZED
    if "fn" in variants:
        fn_outcome = run_variant(opinfo.op, args, "fn", values=values)
        results.append(fn_outcome)
    if "inplace" in variants and opinfo.inplace_variant is not None:
        results.append(run_variant(opinfo.inplace_variant, args, "inplace", values=values))
    make = out_maker(opinfo, args) if "out" in variants else None
    if make is not None:
        results.append(run_variant(opinfo.op, args, "out", make_out=make, values=values))
    random = fn_outcome is not None and fn_outcome.random
    if (
        "grad" in variants
        and dtype == torch.float64
        and opinfo.supports_autograd
        and not random
        and fn_outcome is not None
        and fn_outcome.cls in ("pass", "pass-native")
    ):

        def differentiable(inp, *a, **kw):
            return opinfo.gradcheck_wrapper(opinfo.op, inp, *a, **kw)

        outcome = run_grad(differentiable, grad_args, sample.output_process_fn_grad)
        if outcome is not None:
            results.append(outcome)
    return results
