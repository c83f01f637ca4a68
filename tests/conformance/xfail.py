"""Expected failures of the conformance suite: every entry has a reason, and the table is strict.

An entry names an OpInfo (``full_name``), the class its samples are expected to
fall into (``unsupported`` or ``error``; a ``wrong`` sample is a bug and is
never expected), the variants and dtypes it covers, and for ``unsupported`` the
op that blocks the path to core ATen. A failing sample that no entry explains
fails its test; so does an entry that no sample of its test hits when the test
ran every sample (an unexpected pass: the entry is stale and must go).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Expected", "XFAIL", "BLOCKERS", "PRESET_BLOCKERS", "expected_for", "explains", "preset_entries"]

ALL_VARIANTS = ("fn", "inplace", "out", "grad")


@dataclass(frozen=True)
class Expected:
    cls: str  # "unsupported" or "error"
    reason: str = ""
    blocker: str | None = None  # unsupported: the op the chain got stuck on, e.g. "aten.linalg_svd.default"
    variants: tuple = ALL_VARIANTS
    dtypes: tuple | None = None  # dtype names ("float32"); None: every dtype
    # an entry no sample of an exhaustive test hits fails it (a preset's table is by blocking op,
    # not by OpInfo: its entries are not strict)
    strict: bool = True

    def __post_init__(self):
        if self.cls not in ("unsupported", "error"):
            raise ValueError(f"only unsupported and error samples may be expected, not {self.cls!r}")
        if self.cls == "unsupported" and not self.blocker:
            raise ValueError("an expected unsupported entry names its blocker op")
        if not (self.reason or self.blocker in BLOCKERS):
            raise ValueError(f"entry {self} has no reason")

    def why(self) -> str:
        return self.reason or BLOCKERS[self.blocker]


# Why an op has no path to core ATen (the reason of every unsupported entry naming it).
LAPACK = "a LAPACK-style factorization or solve: no composition of core ops computes it; a backend implements it (or falls back)"
LAPACK_OUT = (
    "the out= form of a factorization written in core ops (linalg.py): eager hands back column-major "
    "outs, which the generic out= rule cannot reproduce, so it is declined"
)
LAYOUT = "a sparse or zero-tensor layout: outside Core ATen, which is strided tensors only"
COMPLEX_VIEW = "reinterprets complex elements as real pairs (or conjugates them): needs a dtype view Core ATen lacks"
BITS = "bit-level integer or float manipulation with no exact core-op form (edge cases: sign of NaN and -0, shifts past the width)"
MODE_LONG = (
    "mode along more than 16 elements: past insertion-sort size, std::sort partitions, and which equal element "
    "ends a run is not reproducible in core ops (selection.py)"
)
BACKWARD = "a backward op with no decomposition in PyTorch's tables (none written here yet)"
EMBEDDING_BAG_LAST = (
    "include_last_offset: the CPU kernel and the meta kernel disagree on the length of bag_size "
    "(and max_indices): declined (embedding_bag.py)"
)
BICUBIC_BACKWARD = "grid_sampler_2d_backward in bicubic mode: declined (grid_sample.py covers bilinear and nearest)"
OUT_ONLY = "an out= overload of a factory or composite op with no functional twin of the same signature"
MISSING = "no decomposition in PyTorch's tables and none written here yet"
DECLINED = "PyTorch's decomposition declines these arguments (it covers only some shapes)"

HISTOGRAM_OUT = (
    "histogram's out= overloads have no meta kernel and their fake reference keeps the outs' empty "
    "shapes, so a traced call (bins=tensor; a range or an empty input) is declined (histogram.py); "
    "the functional forms are exact"
)
STABLE_SORT = "a stable sort: Core ATen's sort makes no stability promise, so nothing in it guarantees one"
# blockers met only by gradients, which the suite computes for float64 samples alone
GRAD_ONLY = ("float64",)

# Ops that have no path to core ATen, and why: the reason of every unsupported entry naming them.
BLOCKERS: dict = {
    "aten._conj.default": COMPLEX_VIEW,
    "aten._efficientzerotensor.default": LAYOUT,
    "aten._embedding_bag_forward_only.default": EMBEDDING_BAG_LAST,
    "aten._linalg_eigh.default": LAPACK,
    "aten._linalg_svd.default": LAPACK,
    "aten._native_batch_norm_legit.out": OUT_ONLY,
    "aten._sparse_mm_reduce_impl.default": LAYOUT,
    "aten._to_sparse.default": LAYOUT,
    "aten._to_sparse.sparse_dim": LAYOUT,
    "aten.geqrf.a": "the out= form of geqrf: its meta kernel leaves the outs unresized where eager resizes them, so no trace can match eager (householder.py declines it)",
    "aten.grid_sampler_2d_backward.default": BICUBIC_BACKWARD,
    "aten.hash_tensor.default": BITS,
    "aten.linalg_eig.default": LAPACK,
    "aten.mode.default": MODE_LONG,
    "aten.sparse_sampled_addmm.default": LAYOUT,
    "aten.view_as_complex.default": COMPLEX_VIEW,
    "aten.view_as_real.default": COMPLEX_VIEW,
}


def U(blocker: str, variants=ALL_VARIANTS, dtypes=None, reason: str = "", strict: bool = True) -> Expected:
    """An expected unsupported entry blocked at ``blocker`` (reason from :data:`BLOCKERS` unless given)."""
    return Expected("unsupported", reason, blocker, tuple(variants), dtypes, strict)


def E(reason: str, variants=ALL_VARIANTS, dtypes=None) -> Expected:
    return Expected("error", reason, None, tuple(variants), dtypes)


# OpInfo full_name -> expected failures (made from a run of the fast slice, then kept true by
# strictness: an entry that no sample hits fails its test)
XFAIL: dict = {
    "_native_batch_norm_legit": (
        U("aten._native_batch_norm_legit.out"),
        E(
            "no_stats_out with 0-size outs: eager hands its first out back unresized, the decomposition's "
            "result has the input's shape; the runtime refuses the mismatch with MismatchError",
            variants=("out",),
            dtypes=("float32", "float64", "bfloat16"),
        ),
    ),
    "cdouble": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "cfloat": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "chalf": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "complex": (U("aten.view_as_real.default"),),
    "fft.fft": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.fft2": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.fftn": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.hfft": (U("aten._conj.default"),),
    "fft.hfft2": (U("aten._conj.default"),),
    "fft.hfftn": (U("aten._conj.default"),),
    "fft.ifft": (
        U("aten._conj.default"),
        U("aten.view_as_real.default"),
    ),
    "fft.ifft2": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.ifftn": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.ihfft": (
        U("aten._conj.default"),
        U("aten.view_as_real.default"),
    ),
    "fft.ihfft2": (
        U("aten.view_as_real.default"),
        U("aten._conj.default"),
    ),
    "fft.ihfftn": (
        U("aten.view_as_real.default"),
        U("aten._conj.default"),
    ),
    "fft.irfft": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.irfft2": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.irfftn": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.rfft": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.rfft2": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "fft.rfftn": (U("aten.view_as_real.default", dtypes=GRAD_ONLY),),
    "grid_sampler_2d": (U("aten.grid_sampler_2d_backward.default", dtypes=GRAD_ONLY),),
    "geqrf": (U("aten.geqrf.a", variants=("out",)),),
    "pca_lowrank": (U("aten._linalg_svd.default"),),
    "svd_lowrank": (U("aten._linalg_svd.default"),),
    "hash_tensor": (U("aten.hash_tensor.default"),),
    "histogram": (
        U("aten.histogram.bins_tensor_out", variants=("out",), reason=HISTOGRAM_OUT),
        U("aten.histogram.bin_ct_out", variants=("out",), reason=HISTOGRAM_OUT),
    ),
    "linalg.cond": (U("aten._linalg_svd.default"),),
    "linalg.eig": (U("aten.linalg_eig.default"),),
    "linalg.eigh": (U("aten._linalg_eigh.default"),),
    "linalg.eigvals": (U("aten.linalg_eig.default"),),
    "linalg.eigvalsh": (U("aten._linalg_eigh.default"),),
    "linalg.matrix_norm": (U("aten._linalg_svd.default", dtypes=("float32", "float64")),),
    "linalg.matrix_rank": (U("aten._linalg_svd.default"),),
    "linalg.matrix_rank.hermitian": (U("aten._linalg_eigh.default"),),
    "linalg.pinv.singular": (
        U(
            "aten.linalg_pinv.atol_rtol_tensor",
            variants=("fn",),
            reason="pinv of a matrix with singular values at rounding level: whether each falls under eager's cutoff (eps * max(m, n) * s_max) depends on eager's own SVD's rounding, so lstsq.py declines a call with a singular value within max(tol/2, 4 eps s_max) of the cutoff",
        ),
    ),
    "linalg.svd": (U("aten._linalg_svd.default"),),
    "linalg.svdvals": (U("aten._linalg_svd.default"),),
    "matrix_exp": (
        U(
            "aten.linalg_matrix_exp.default",
            dtypes=("bfloat16",),
            reason="matrix_exp at bfloat16: eager's kernel returns NaN and inf for ordinary inputs (float64 thresholds, bfloat16 arithmetic); matfuncs.py declines 16-bit floats rather than answer otherwise",
        ),
    ),
    "mode": (U("aten.mode.default"),),
    "nn.functional.embedding_bag": (U("aten._embedding_bag_forward_only.default"),),
    "nn.functional.grid_sample": (U("aten.grid_sampler_2d_backward.default", dtypes=GRAD_ONLY),),
    "norm.nuc": (U("aten._linalg_svd.default"),),
    "polar": (U("aten.view_as_real.default"),),
    "sgn": (U("aten._efficientzerotensor.default", dtypes=GRAD_ONLY),),
    "sparse.mm.reduce": (U("aten._sparse_mm_reduce_impl.default"),),
    "sparse.sampled_addmm": (U("aten.sparse_sampled_addmm.default"),),
    "stft": (U("aten.view_as_real.default"),),
    "svd": (U("aten._linalg_svd.default"),),
    "to_sparse": (
        U("aten._to_sparse.default"),
        U("aten._to_sparse.sparse_dim"),
    ),
    "view_as_complex": (U("aten.view_as_complex.default"),),
    "linalg.norm": (U("aten._linalg_svd.default", dtypes=("float32", "float64")),),
    "linalg.norm.subgradients_at_zero": (U("aten._linalg_svd.default", dtypes=("float32", "float64")),),
    "addbmm": (
        E(
            "eager's addbmm_ resizes a broadcastable self in place (its out= path); the in-place rule "
            "refuses to change self's shape and raises",
            variants=("inplace",),
        ),
    ),
}


def expected_for(name: str, dtype_name: str, opset: str | None = None) -> list:
    """The entries that apply to one test (an OpInfo at one dtype) under ``opset`` (None: the
    harness's, ``EAGERDECOMP_CONFORMANCE_OPSET``)."""
    if opset is None:
        from .harness import OPSET as opset
    entries = XFAIL.get(name, ())
    if isinstance(entries, Expected):
        entries = (entries,)
    entries = [e for e in entries if e.dtypes is None or dtype_name in e.dtypes]
    if opset != "core_aten":
        # NOTE: core ATen's expected errors are the runtime's own rules (addbmm_'s broadcast self),
        # which a preset meets where its path takes the same rule: not strict there
        errors = [dataclasses.replace(e, strict=False) for e in entries if e.cls == "error"]
        return errors + preset_entries(opset)
    return entries


def explains(entry: Expected, outcome) -> bool:
    return (
        outcome.cls == entry.cls
        and outcome.variant in entry.variants
        and (entry.blocker is None or outcome.blocker == entry.blocker)
    )


def preset_entries(opset: str) -> list:
    """Under a preset other than core ATen: every op of its :data:`PRESET_BLOCKERS` table may
    block any OpInfo (not strict: the table is by blocking op)."""
    return [U(op, reason=why, strict=False) for op, why in PRESET_BLOCKERS.get(opset, {}).items()]


# Under a preset other than core ATen the chain stops at other ops (the preset lacks ops core
# ATen keeps): its table is by blocking op, each with why it has no path.
# Core ATen's blockers block there too (no decomposition at all, or one that declines).
PRIMS_FUSION_BLOCKERS = {
    **BLOCKERS,
    "aten.histogram.bins_tensor_out": HISTOGRAM_OUT,
    "aten.histogram.bin_ct_out": HISTOGRAM_OUT,
    "aten.linalg_matrix_exp.default": "matrix_exp at bfloat16: eager's kernel returns NaN and inf for ordinary inputs; matfuncs.py declines 16-bit floats",
    "aten.linalg_pinv.atol_rtol_tensor": "pinv of a matrix with singular values at rounding level: declined near eager's cutoff (lstsq.py)",
    "aten._adaptive_avg_pool2d_backward.default": (
        "adaptive average pooling's gradient at an empty input: pooling.py's decomposition (the preset's path; "
        "core ATen keeps the op) declines 0-size shapes"
    ),
}
PRESET_BLOCKERS: dict = {"prims_fusion": PRIMS_FUSION_BLOCKERS}
