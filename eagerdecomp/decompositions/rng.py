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
``randn_like`` and ``normal_`` on contiguous tensors. Ops whose native kernel
uses the generator in another way (integer draws, bernoulli, ``normal_`` on a
non-contiguous tensor, which the CPU kernel fills element by element) get the
right distribution from another stream: the report marks every op whose
kernel draws random numbers.

An explicit ``generator=`` is drawn from with ``rand.generator`` /
``randn.generator`` (the uniform and normal decompositions). Core ATen keeps neither, so
under ``core_aten`` such calls have no path and say so; an opset that adds
them gets the generator's own stream. The other decompositions decline a generator.
"""

from __future__ import annotations

import math

import torch
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.variants import resize_out

aten = torch.ops.aten

_REDUCED = (torch.float16, torch.bfloat16)
# significand bits: random_() on a floating tensor draws integers in [0, 2**digits]
_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


# NOTE: an explicit generator= is drawn from with the generator overloads of rand/randn. Core
# ATen keeps neither, so under core_aten such a call has no path (a clear UnsupportedOpError);
# an opset that adds them (a backend with its own Generator) gets the generator's exact stream.
_WITH_GENERATOR = {aten.rand.default: aten.rand.generator, aten.randn.default: aten.randn.generator}


def _fresh(draw, size, generator=None, **kwargs):
    """``draw(size, **kwargs)``, from ``generator`` when one is given."""
    if generator is None:
        return draw(size, **kwargs)
    return _WITH_GENERATOR[draw](size, generator=generator, **kwargs)


def _draw(draw, like, dtype=None, device=None, generator=None):
    """``draw`` (aten.rand or aten.randn) shaped and strided as ``empty_like(like)``."""
    perm = compute_elementwise_output_logical_to_physical_perm(like)[0] if like.dim() else []
    physical = [like.shape[d] for d in perm]
    out = _fresh(draw, physical, generator, dtype=dtype or like.dtype, device=device or like.device)
    inverse = [perm.index(d) for d in range(len(perm))]
    return aten.permute.default(out, inverse) if inverse != list(range(len(inverse))) else out


def _declines(memory_format=None) -> bool:
    return memory_format not in (None, torch.preserve_format)


@project_decomposition(aten.rand_like.default)
def rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _draw(aten.rand.default, self, dtype, device)


@project_decomposition(aten.randn_like.default)
def randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _draw(aten.randn.default, self, dtype, device)


def _scaled(draw, self, scale, shift, generator=None):
    """``draw * scale + shift`` in the dtype's opmath type, as the native kernels compute it."""
    acc = torch.float32 if self.dtype in _REDUCED else self.dtype
    out = _draw(draw, self, acc, generator=generator)
    if scale != 1:
        out = aten.mul.Tensor(out, scale)
    if shift != 0:
        out = aten.add.Tensor(out, shift)
    return out if acc == self.dtype else aten._to_copy.default(out, dtype=self.dtype)


@project_decomposition(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator=None):
    # NOTE: uniform_ (every nn.init.*uniform_) reaches this through the in-place variant rule
    if not self.dtype.is_floating_point:
        return NotImplemented
    return _scaled(aten.rand.default, self, to - from_, from_, generator)


@project_decomposition(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    # NOTE: normal_ has no functional overload of the same signature; write it in place here
    if not self.dtype.is_floating_point:
        return NotImplemented
    return aten.copy_.default(self, _scaled(aten.randn.default, self, std, mean, generator))


@project_decomposition(aten.normal.Tensor_float)
def normal_tensor_float(mean, std=1.0, *, generator=None):
    return aten.add.Tensor(_scaled(aten.randn.default, mean, std, 0.0, generator), mean)


@project_decomposition(aten.normal.Tensor_float_out)
def normal_tensor_float_out(mean, std=1.0, *, generator=None, out):
    # NOTE: eager broadcasts mean with out's *current* shape, not mean's alone, so a
    # wrongly sized out raises there (the generic out= rule would resize it): same here
    shape = list(torch.broadcast_shapes(mean.shape, out.shape))
    resize_out(out, shape)
    return aten.copy_.default(out, normal_tensor_float(aten.expand.default(mean, shape), std, generator=generator))


@project_decomposition(aten.normal.float_Tensor)
def normal_float_tensor(mean, std, *, generator=None):
    return aten.add.Tensor(aten.mul.Tensor(_draw(aten.randn.default, std, generator=generator), std), mean)


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


def _integers(self, low, high, dtype=None, device=None):
    """Uniform integers in ``[low, high)`` from a float64 draw: floor(u * (high - low)) + low.

    NOTE: the native kernels take 32 or 64 random bits modulo the range; this takes 53
    bits, so the distribution is the same (to 2**-53) but the stream is not.
    """
    dtype = dtype or self.dtype
    u = _draw(aten.rand.default, self, torch.float64, device)
    ints = aten.floor.default(aten.mul.Tensor(u, float(high - low)))
    return aten._to_copy.default(aten.add.Tensor(ints, low), dtype=dtype)


def _dtype_high(dtype) -> int:
    """Upper bound (exclusive) of ``random_()`` with no range, as eager defines it."""
    if dtype == torch.bool:
        return 2
    if dtype.is_floating_point:
        return 2 ** _DIGITS[dtype] + 1  # [0, 2**digits], both ends included
    return torch.iinfo(dtype).max + 1


@project_decomposition(aten.random.default)
def random(self, *, generator=None):
    if generator is not None or self.dtype == torch.int64 or self.dtype.is_complex:
        return NotImplemented  # int64's range needs 63 random bits: more than a float64 draw holds
    return _integers(self, 0, _dtype_high(self.dtype))


@project_decomposition(aten.random.to)
def random_to(self, to, *, generator=None):
    if generator is not None or to > 2**53:
        return NotImplemented
    return _integers(self, 0, to)


@project_decomposition("aten::random.from")
def random_from(self, from_, to=None, *, generator=None):
    high = _dtype_high(self.dtype) if to is None else to
    if generator is not None or high - from_ > 2**53:
        return NotImplemented
    return _integers(self, from_, high)


@project_decomposition(aten.randint_like.default)
def randint_like(self, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _integers(self, 0, high, dtype, device)


@project_decomposition(aten.randint_like.low_dtype)
def randint_like_low(self, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if _declines(memory_format):
        return NotImplemented
    return _integers(self, low, high, dtype, device)


@project_decomposition(aten.randint.default)
def randint(high, size, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return randint_low(0, high, size, dtype=dtype, device=device)


@project_decomposition(aten.randint.low)
def randint_low(low, high, size, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    u = aten.rand.default(size, dtype=torch.float64, device=device)
    ints = aten.floor.default(aten.mul.Tensor(u, float(high - low)))
    return aten._to_copy.default(aten.add.Tensor(ints, low), dtype=dtype if dtype is not None else torch.int64)


@project_decomposition(aten.geometric.default)
def geometric(self, p, *, generator=None):
    # NOTE: torch's ref draws rand_like(self), which integer tensors cannot hold; the
    # number of Bernoulli(p) trials to the first success, from a float64 uniform
    if generator is not None:
        return NotImplemented
    u = _draw(aten.rand.default, self, torch.float64)
    trials = aten.ceil.default(aten.div.Tensor(aten.log1p.default(aten.neg.default(u)), math.log1p(-p)))
    trials = aten.clamp.default(trials, 1)  # u == 0 (odds 2**-53) would give 0 trials
    return aten._to_copy.default(trials, dtype=self.dtype)


@project_decomposition(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator=None):
    # NOTE: dropout's training path needs it. One uniform per element, as the CPU kernel
    # draws, but compared as `u < p` where the kernel compares in its own way: the same
    # distribution, another stream.
    if generator is not None:
        return NotImplemented
    acc = self.dtype if self.dtype in (torch.float32, torch.float64) else torch.float32
    u = _draw(aten.rand.default, self, acc)
    return aten._to_copy.default(aten.lt.Scalar(u, p), dtype=self.dtype)


@project_decomposition(aten.bernoulli.Tensor)
def bernoulli_tensor(self, p, *, generator=None):
    if generator is not None:
        return NotImplemented
    acc = torch.float64 if p.dtype == torch.float64 else torch.float32
    u = _draw(aten.rand.default, self, acc)
    return aten._to_copy.default(aten.lt.Tensor(u, p), dtype=self.dtype)


@project_decomposition(aten.randperm.out)
def randperm_out(n, *, out):
    # NOTE: no functional twin of this signature (randperm takes dtype=, out= gives it): the
    # core randperm in out's dtype draws the same numbers the out= kernel does
    result = aten.randperm.default(n, dtype=out.dtype, device=out.device)
    resize_out(out, result.shape)
    return aten.copy_.default(out, result)


# NOTE: multinomial has no decomposition in PyTorch. With replacement: inverse CDF, each draw
# the first category whose cumulative probability (float64) reaches a uniform in (0, 1].
# Without replacement: the exponential race the CPU kernel also runs (Gumbel top-k): category i
# finishes at E_i / p_i with E_i ~ Exp(1), and the first num_samples to finish, in finishing
# order, are distributed as successive draws without replacement. Same distribution as the native
# kernel, another stream (it draws differently); eager's argument errors are checked first,
# and those that read the probabilities make the call run on the bypass path.
def _multinomial_checks(self, n_sample, replacement):
    if self.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {self.dtype}")
    if n_sample <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and n_sample > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    bad = aten.logical_or.default(aten.logical_not.default(aten.isfinite.default(self)), aten.lt.Scalar(self, 0))
    if aten._local_scalar_dense.default(aten.any.default(bad)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    rows = self if self.dim() == 2 else aten.unsqueeze.default(self, 0)
    if aten._local_scalar_dense.default(aten.any.default(aten.le.Scalar(aten.sum.dim_IntList(rows, [1]), 0))):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


@project_decomposition(aten.multinomial.default)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    if generator is not None:
        return NotImplemented
    _multinomial_checks(self, num_samples, replacement)
    rows = aten._to_copy.default(self if self.dim() == 2 else aten.unsqueeze.default(self, 0), dtype=torch.float64)
    b, n = rows.shape
    if replacement:
        cdf = aten.cumsum.default(aten.div.Tensor(rows, aten.sum.dim_IntList(rows, [1], True)), 1)  # [b, n]
        u = aten.rsub.Scalar(
            aten.rand.default([b, num_samples], dtype=torch.float64, device=self.device), 1.0
        )  # (0, 1]
        below = aten.lt.Tensor(aten.unsqueeze.default(cdf, 1), aten.unsqueeze.default(u, 2))  # [b, s, n]
        picks = aten.clamp.default(aten.sum.dim_IntList(below, [2]), None, n - 1)
        # rounding can leave the last cumulative sum under u: the last category with mass, not a zero one
        last = aten.sub.Tensor(
            aten.sub.Scalar(aten.full.default([b, 1], n, dtype=torch.int64, device=self.device), 1),
            aten.argmax.default(
                aten._to_copy.default(aten.flip.default(aten.gt.Scalar(rows, 0), [1]), dtype=torch.int64), 1, True
            ),
        )
        picks = aten.minimum.default(picks, last)
    else:
        # as the CPU kernel: the largest p / E (zero-probability categories tie at 0, and come last)
        e = aten.neg.default(
            aten.log1p.default(aten.neg.default(aten.rand.default([b, n], dtype=torch.float64, device=self.device)))
        )
        picks = aten.topk.default(aten.div.Tensor(rows, e), num_samples, 1, True, True)[1]
    picks = aten._to_copy.default(picks, dtype=torch.int64)
    return picks if self.dim() == 2 else aten.squeeze.dim(picks, 0)
