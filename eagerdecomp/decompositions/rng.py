"""Random ops, drawn from the three random ops Core ATen keeps: ``rand``, ``randn``, ``randperm``.

PyTorch's tables leave the everyday random ops without a path to core ATen
(``uniform_`` and ``normal_``, which every ``nn.init`` function calls, lower
through prims that call them back; ``rand_like`` and ``random_`` have no
decomposition at all). These decompositions close that gap.

Every draw is made in the *memory order* of the tensor it fills: ``rand`` over
the physical shape, then a ``permute`` back to the logical one. That is the
order the CPU kernels fill ``empty_like(self)`` in, so ``rand_like`` and
``uniform_`` draw the same numbers as eager from the same ``torch.manual_seed``
(up to the last bit where the native kernel fuses a multiply-add), and so do
``randn_like`` and ``normal_``, in the kernel's two orders (see ``_draw``). ``bernoulli`` (dropout's
masks), ``exponential`` and ``geometric`` draw the float64 uniform the CPU kernel
draws per element and transform it as it does. The integer draws are in
:mod:`.randint`, ``multinomial`` in :mod:`.multinomial`; :data:`STREAM_DIFFERS`
says, for the report, which draws still differ from eager's and why.

An explicit ``generator=`` is drawn from with ``rand.generator`` /
``randn.generator``: an opset that keeps them gets the generator's own stream
from its backend; under core ATen :mod:`.generators` lends the generator's state
to the default generator for the draw.
"""

from __future__ import annotations

import math

import torch
import torch._prims_common as utils
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten

_REDUCED = (torch.float16, torch.bfloat16)
# significand bits: random_() on a floating tensor draws integers in [0, 2**digits]
_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


# NOTE: an explicit generator= is drawn from with the generator overloads of rand/randn: an
# opset that adds them (a backend with its own Generator) gets the generator's exact stream; under
# core ATen, generators.py lends the generator's state to the default generator for the draw.
_WITH_GENERATOR = {aten.rand.default: aten.rand.generator, aten.randn.default: aten.randn.generator}


def _fresh(draw, size, generator=None, **kwargs):
    """``draw(size, **kwargs)``, from ``generator`` when one is given."""
    if generator is None:
        return draw(size, **kwargs)
    return _WITH_GENERATOR[draw](size, generator=generator, **kwargs)


# NOTE: the CPU normal kernel fills a contiguous tensor of 16 or more elements in vectorized
# blocks (in the dtype's opmath type), and anything else one Box-Muller pair at a time in memory
# order, in float64, the pair's second value kept in the generator for the next draw: a small
# tensor, randn_like of a permuted one (VITS's noise), normal_ on a non-contiguous one.
# Consecutive randn calls of fewer than 16 elements take that path too and hand the kept value
# on, so drawn that way the numbers are eager's. Past _PAIRWISE_MAX elements (one call per 15) a
# non-contiguous draw stays vectorized: another stream, which the report says (STREAM_DIFFERS).
_VECTORIZED_FROM, _PAIR_CHUNK, _PAIRWISE_MAX = 16, 15, 1 << 16


def _pairwise(numel, contiguous: bool) -> bool:
    """Whether eager's normal kernel draws ``numel`` elements one pair at a time (and we can)."""
    return numel < _VECTORIZED_FROM or (not contiguous and numel <= _PAIRWISE_MAX)


def _contiguous(shape, perm) -> bool:
    """Whether the layout ``empty_like`` gives (``perm``: logical to physical) is contiguous, by
    ATen's rule (size-1 dims do not count)."""
    return [d for d in perm if shape[d] != 1] == sorted(d for d in perm if shape[d] != 1)


def _draw(draw, like, dtype=None, device=None, generator=None, pairwise=None, contiguous=False, blocks=False):
    """``draw`` (aten.rand or aten.randn) shaped and strided as ``empty_like(like)`` (``contiguous``:
    as a contiguous tensor of its shape); ``pairwise`` (randn only; default: as eager's kernel
    would fill that layout) draws the one pair at a time numbers; ``blocks``: a float32 randn in
    the order the vectorized fill of a 16-bit float takes (below)."""
    if like.dim() and not contiguous:
        perm = compute_elementwise_output_logical_to_physical_perm(like)[0]
    else:
        perm = list(range(like.dim()))
    physical = [like.shape[d] for d in perm]
    dtype, device = dtype or like.dtype, device or like.device
    if pairwise is None:
        pairwise = draw is aten.randn.default and _pairwise(like.numel(), _contiguous(like.shape, perm))
    n = like.numel()
    if pairwise and n >= _VECTORIZED_FROM:
        chunks = [
            _fresh(draw, [min(_PAIR_CHUNK, n - i)], generator, dtype=dtype, device=device)
            for i in range(0, n, _PAIR_CHUNK)
        ]
        out = aten.view.default(aten.cat.default(chunks), physical)
    elif blocks and n > _VECTORIZED_FROM and n % _VECTORIZED_FROM:
        # NOTE: a 16-bit float's fill draws 16 uniforms per block and 16 fresh ones for the last
        # 16 elements; a float32 fill draws every element's uniform first, then 16 for the tail
        whole = _fresh(draw, [n - n % _VECTORIZED_FROM], generator, dtype=dtype, device=device)
        tail = _fresh(draw, [_VECTORIZED_FROM], generator, dtype=dtype, device=device)
        head = aten.slice.Tensor(whole, 0, 0, n - _VECTORIZED_FROM)
        out = aten.view.default(aten.cat.default([head, tail]), physical)
    else:
        out = _fresh(draw, physical, generator, dtype=dtype, device=device)
    inverse = [perm.index(d) for d in range(len(perm))]
    return aten.permute.default(out, inverse) if inverse != list(range(len(inverse))) else out


def _declines(memory_format=None) -> bool:
    return memory_format not in (None, torch.preserve_format)


@project_decomposition([aten.rand_like.default, aten.rand_like.generator])
def rand_like(self, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _draw(aten.rand.default, self, dtype, device, generator)


@project_decomposition([aten.randn_like.default, aten.randn_like.generator])
def randn_like(self, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _draw(aten.randn.default, self, dtype, device, generator)


# NOTE: the CPU kernels are built with fused multiply-adds on AVX2 and AVX-512: the normal fill
# computes n * std + mean (std and mean rounded to its opmath type first), uniform_ x * span + from,
# each rounded once. A product of two floats is exact in float64, so float64 arithmetic rounded
# back to float is the fused result (unless the float64 sum lands on a float tie: about 2**-29 of
# draws); float64 takes Dekker's exact product and Knuth's exact sum.
_FUSED = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _split(x):
    """Veltkamp's split of float64 ``x`` into two halves of 26 bits: ``x == hi + lo`` exactly."""
    if isinstance(x, float):
        c = x * 134217729.0
        hi = c - (c - x)
        return hi, x - hi
    c = aten.mul.Tensor(x, 134217729.0)
    hi = aten.sub.Tensor(c, aten.sub.Tensor(c, x))
    return hi, aten.sub.Tensor(x, hi)


def _fused_multiply_add(x, scale: float, shift: float):
    """``x * scale + shift`` for float64 ``x``, rounded once: the exact product as two float64s,
    the exact sum as two, then one rounding of their total (checked against the kernel on 100,000
    draws)."""
    mul, add, sub = aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor
    p = mul(x, scale)
    (xh, xl), (sh, sl) = _split(x), _split(scale)
    e = add(add(add(sub(mul(xh, sh), p), mul(xh, sl)), mul(xl, sh)), mul(xl, sl))
    total = add(p, shift)
    back = sub(total, p)
    t = add(sub(p, sub(total, back)), sub(shift, back))
    return add(total, add(t, e))


def _multiply_add(x, scale: float, shift: float):
    """``x * scale + shift`` in ``x``'s dtype (float32 or float64, which hold ``scale`` and
    ``shift`` exactly), rounded as the CPU kernels round it."""
    if scale == 1 and shift == 0:
        return x
    if not _FUSED:
        return aten.add.Tensor(aten.mul.Tensor(x, scale), shift)
    if x.dtype == torch.float64:
        return _fused_multiply_add(x, scale, shift)
    wide = aten._to_copy.default(x, dtype=torch.float64)
    return aten._to_copy.default(aten.add.Tensor(aten.mul.Tensor(wide, scale), shift), dtype=x.dtype)


def _rounded(value: float, dtype) -> float:
    return torch.tensor(value, dtype=dtype).item()


def _normal(self, std, mean, generator=None, pairwise=False, contiguous=False):
    """``randn * std + mean`` shaped as ``self``, as the CPU normal kernel computes it: one pair
    at a time in float64 (``pairwise``), or the vectorized fill in the opmath type (a 16-bit
    float's in its blocks of 16), its std and mean rounded to that type."""
    acc = torch.float64 if pairwise else torch.float32 if self.dtype in _REDUCED else self.dtype
    blocks = not pairwise and self.dtype in _REDUCED
    x = _draw(
        aten.randn.default, self, acc, generator=generator, pairwise=pairwise, contiguous=contiguous, blocks=blocks
    )
    out = _multiply_add(x, _rounded(std, acc), _rounded(mean, acc))
    return out if out.dtype == self.dtype else aten._to_copy.default(out, dtype=self.dtype)


@project_decomposition(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator=None):
    # NOTE: uniform_ (every nn.init.*uniform_) reaches this through the in-place variant rule
    if not self.dtype.is_floating_point:
        return NotImplemented
    # NOTE: the kernel rounds from and to to the opmath type, takes their difference there and
    # computes x * (to - from) + from (fused on AVX2), then a result that rounds up to `to` in
    # the tensor's dtype is `from` (kaiming_uniform_'s +-1/sqrt(fan_in) bounds made 42% of
    # float32 draws differ in the last bit when computed unfused, from Python's double bounds)
    acc = torch.float32 if self.dtype in _REDUCED else self.dtype
    low, high = (torch.tensor(v, dtype=acc) for v in (from_, to))
    out = _multiply_add(_draw(aten.rand.default, self, acc, generator=generator), (high - low).item(), low.item())
    if out.dtype != self.dtype:
        out = aten._to_copy.default(out, dtype=self.dtype)
    top = _rounded(to, self.dtype)
    return aten.where.self(aten.eq.Scalar(out, top), aten.full_like.default(out, from_), out)


@project_decomposition(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    # NOTE: normal_ has no functional overload of the same signature; write it in place here
    if not self.dtype.is_floating_point:
        return NotImplemented
    pairwise = _pairwise(self.numel(), utils.is_contiguous(self))  # eager asks of self itself
    return aten.copy_.default(self, _normal(self, std, mean, generator, pairwise))


@project_decomposition(aten.normal.Tensor_float)
def normal_tensor_float(mean, std=1.0, *, generator=None):
    # eager: normal_(0, std) on a fresh contiguous tensor of mean's shape, then add_(mean)
    pairwise = _pairwise(mean.numel(), True)
    noise = _normal(mean, std, 0.0, generator, pairwise, contiguous=True)
    return aten.add.Tensor(noise, mean)


@project_decomposition(aten.normal.Tensor_float_out)
def normal_tensor_float_out(mean, std=1.0, *, generator=None, out):
    # NOTE: eager broadcasts mean with out's *current* shape, not mean's alone, so a
    # wrongly sized out raises there (the generic out= rule would resize it): same here
    shape = list(torch.broadcast_shapes(mean.shape, out.shape))
    resize_out(out, shape)
    return aten.copy_.default(out, normal_tensor_float(aten.expand.default(mean, shape), std, generator=generator))


@project_decomposition(aten.normal.float_Tensor)
def normal_float_tensor(mean, std, *, generator=None):
    # eager: normal_(0, 1) on a fresh contiguous tensor of std's shape, then mul_(std).add_(mean)
    noise = _draw(aten.randn.default, std, generator=generator, contiguous=True)
    return aten.add.Tensor(aten.mul.Tensor(noise, std), mean)


@project_decomposition(aten.normal.Tensor_Tensor)
def normal_tensor_tensor(mean, std, *, generator=None):
    # eager resizes a fresh contiguous output to the broadcast shape, then fills it
    shape = list(torch.broadcast_shapes(mean.shape, std.shape))
    noise = _fresh(aten.randn.default, shape, generator, dtype=torch.result_type(mean, std), device=mean.device)
    return aten.add.Tensor(aten.mul.Tensor(noise, std), mean)


@project_decomposition(aten.normal.float_float)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    noise = _fresh(aten.randn.default, size, generator, dtype=dtype, device=device)
    return aten.add.Tensor(aten.mul.Tensor(noise, std), mean)


@project_decomposition(aten.normal_functional.default)
def normal_functional(self, mean=0.0, std=1.0, *, generator=None):
    # NOTE: eager's functional twin of normal_ (autogenerated): normal_ on a clone of self
    if not self.dtype.is_floating_point:
        return NotImplemented
    return normal_(aten.clone.default(self), mean, std, generator=generator)


@project_decomposition(aten.normal.out)
def normal_out(self, mean=0.0, std=1.0, *, generator=None, out):
    # NOTE: torch's ref `normal`, registered for every overload, reads this one's self as the
    # mean and raises; eager's (autogenerated) kernel is normal_functional, resized into out.
    # That ref is also the meta kernel (runtime/exact.py), so eager's check on std is made here.
    torch._check(std >= 0.0, lambda: f"normal expects std >= 0.0, but found std {std}")
    result = normal_functional(self, mean, std, generator=generator)
    if result is NotImplemented:
        return NotImplemented
    resize_out(out, result.shape)
    return aten.copy_.default(out, result)


@project_decomposition(aten.geometric.default)
def geometric(self, p, *, generator=None):
    # NOTE: torch's ref draws rand_like(self), which integer tensors cannot hold. The CPU kernel
    # (geometric_distribution<double>) takes ceil(log(u) / log1p(-p)) of a float64 uniform:
    # the same here, eager's numbers but where log's last bit decides a ceiling
    u = _draw(aten.rand.default, self, torch.float64, generator=generator)
    trials = aten.ceil.default(aten.div.Tensor(aten.log.default(u), math.log1p(-p)))
    return aten._to_copy.default(trials, dtype=self.dtype)


@project_decomposition(aten.exponential.default)
def exponential(self, lambd=1.0, *, generator=None):
    # NOTE: torch's ref draws a uniform in self's dtype; the CPU kernel draws a float64 one per
    # element (exponential_distribution<double>) and computes -1/lambda * log1p(-u) in double,
    # then rounds to self's dtype. So here: eager's numbers, but for the last bit of log1p,
    # which the vectorized kernel and the C library may round apart (float64 results only).
    if not self.dtype.is_floating_point or not lambd > 0:
        return NotImplemented  # eager's argument errors come from its kernel's checks
    u = _draw(aten.rand.default, self, torch.float64, generator=generator)
    out = aten.mul.Tensor(aten.log1p.default(aten.neg.default(u)), -1.0 / lambd)
    return out if self.dtype == torch.float64 else aten._to_copy.default(out, dtype=self.dtype)


# NOTE: torch's refs have in-place forms of these two, which a prims opset's table takes before
# the in-place variant rule would reach the functional ones above: their draws are not eager's
# (a uniform in self's dtype; for an integer geometric_ on edprims, refused by the uniform_ kernel
# that fills it). Written in place here, as under core ATen.
@project_decomposition(aten.geometric_.default)
def geometric_(self, p, *, generator=None):
    return aten.copy_.default(self, geometric(self, p, generator=generator))


@project_decomposition(aten.exponential_.default)
def exponential_(self, lambd=1.0, *, generator=None):
    out = exponential(self, lambd, generator=generator)
    return NotImplemented if out is NotImplemented else aten.copy_.default(self, out)


@project_decomposition(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator=None):
    # NOTE: dropout's training path on CPU (aten::dropout is bernoulli_(1 - p) there, never
    # native_dropout). The CPU kernel draws one float64 uniform per element, in memory order,
    # whatever self's dtype (bernoulli_distribution<double>: u < p), so this is eager's mask
    # bit for bit. (PyTorch built inside Meta (FBCODE_CAFFE2) draws through MKL instead.)
    u = _draw(aten.rand.default, self, torch.float64, generator=generator)
    return aten._to_copy.default(aten.lt.Scalar(u, p), dtype=self.dtype)


@project_decomposition(aten.bernoulli.Tensor)
def bernoulli_tensor(self, p, *, generator=None):
    # the kernel's uniform is float64 for a float64 p, else float32 (bernoulli_distribution<float>)
    acc = torch.float64 if p.dtype == torch.float64 else torch.float32
    u = _draw(aten.rand.default, self, acc, generator=generator)
    return aten._to_copy.default(aten.lt.Tensor(u, p), dtype=self.dtype)


@project_decomposition(aten.randperm.out)
def randperm_out(n, *, out):
    # NOTE: no functional twin of this signature (randperm takes dtype=, out= gives it): the
    # core randperm in out's dtype draws the same numbers the out= kernel does
    result = aten.randperm.default(n, dtype=out.dtype, device=out.device)
    resize_out(out, result.shape)
    return aten.copy_.default(out, result)


# NOTE: what the report says of each random op's numbers (runtime/stats.py reads these): under
# the same seed, the draws of the ops in STREAM_DIFFERS differ from the CPU kernel's where the
# text says, and why; those in EAGER_STREAM are eager's. An op's in-place and out= variants are
# read through its functional op. Both speak of the decompositions in this package only.
_BITS = (
    "eager's numbers only where the range divides 2**24 (2**53 for a 64-bit draw: int64, float64, wide ranges): "
    "core ATen's rand shows no more of a draw's bits; the low 53 bits of a 64-bit draw are eager's, and 32-bit "
    "draws over ranges past 2**12 take two of the generator's outputs where eager takes one (decompositions/randint.py)"
)
_PAIRS = (
    "a non-contiguous result of over 65,536 elements (the CPU kernel draws it one pair at a time, as rng.py "
    "does up to there)"
)
STREAM_DIFFERS = {
    aten.random.default: _BITS,
    getattr(aten.random, "from"): _BITS,
    aten.random.to: _BITS,
    aten.randint.default: _BITS,
    aten.randint.generator: _BITS,
    aten.randint.low: _BITS,
    aten.randint.low_generator: _BITS,
    aten.randint_like.default: _BITS,
    aten.randint_like.generator: _BITS,
    aten.randint_like.low_dtype: _BITS,
    aten.randint_like.low_generator_dtype: _BITS,
    aten.normal_.default: _PAIRS,
    aten.randn_like.default: _PAIRS,
    aten.randn_like.generator: _PAIRS,
    aten.exponential.default: "float64 results, in the last bit, where the vectorized log1p and the C library's differ",
    aten.multinomial.default: (
        "with replacement, two or more samples and over 1024 float32 or 16-bit categories: cumulative sums "
        "rounded from float64 where the kernel adds in float32 (decompositions/multinomial.py); float64 "
        "probabilities without replacement or one sample: where two ratios tie to the last bit of log1p"
    ),
}
EAGER_STREAM = frozenset(
    {
        aten.rand_like.default,
        aten.rand_like.generator,
        aten.normal.Tensor_Tensor,
        aten.normal.Tensor_float,
        aten.uniform.default,
        aten.normal.float_Tensor,
        aten.normal.float_float,
        aten.bernoulli.p,
        aten.bernoulli.Tensor,
        aten.geometric.default,
        aten.randperm.out,
        aten.rand.generator,
        aten.randn.generator,
        aten.randperm.generator,
        aten.randperm.generator_out,
    }
)
