"""``multinomial``, drawn as ATen's CPU kernels draw it (``native/Distributions.cpp``,
``native/cpu/MultinomialKernel.cpp``); PyTorch has no decomposition.

* Without replacement, or one sample (``Categorical.sample()``): the exponential race. Eager
  fills ``q = empty_like(p).exponential_()`` (one float64 uniform per element, in memory order;
  ``-log1p(-u)`` rounded to p's dtype), divides ``p / q`` in p's dtype and takes ``argmax`` (one
  sample) or ``topk``. Here the same ops: eager's draws, but for the last bit of float64
  ``log1p``, which the vectorized kernel and the C library may round apart (a float64 p only:
  rounding to float32 hides it), and which decides a pick only where two ratios tie to it.
* With replacement and more samples: per row, the cumulative sums of p in p's dtype (float32
  for 16-bit p), summed one category after another, divided by the total, the last set to 1;
  then one float64 uniform per sample, row after row, and the first category whose cumulative
  value is not below it. The sums are the kernel's only if made in its order and precision:
  ``cumsum`` accumulates float32 in float64 on the CPU, so for a float32 p they are added here one
  category at a time (one ``add`` per category in the kernel), eager's numbers up to
  ``SEQUENTIAL_CATEGORIES`` categories. Past it, ``cumsum``'s sums, rounded to float32: a draw
  differs from eager's only where its uniform falls between eager's rounding of a cumulative
  sum and this one's (odds about one in 2**24 per category boundary). A float64 p is summed by
  ``cumsum`` itself, in the kernel's order and precision: eager's numbers at any size.

eager's argument errors are checked first; those that read the probabilities make the call
run on the bypass path.
"""

from __future__ import annotations

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.decompositions.rng import _draw, _fresh

__all__ = ["SEQUENTIAL_CATEGORIES"]

aten = torch.ops.aten

# widest float32/16-bit row whose cumulative sums are added one category at a time (eager's)
SEQUENTIAL_CATEGORIES = 1024


def _checks(self, n_sample, replacement, race):
    if self.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {self.dtype}")
    if n_sample <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and n_sample > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if self.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if self.numel() == 0:
        return
    rows = self if self.dim() == 2 else aten.unsqueeze.default(self, 0)
    if race:  # the fast path's checks (Distributions.cpp)
        bad = aten.logical_or.default(aten.logical_not.default(aten.isfinite.default(self)), aten.lt.Scalar(self, 0))
        if aten._local_scalar_dense.default(aten.any.default(bad)):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    else:  # the kernel's, in its words
        if aten._local_scalar_dense.default(aten.any.default(aten.lt.Scalar(self, 0))):
            raise RuntimeError("invalid multinomial distribution (encountering probability entry < 0)")
        if not aten._local_scalar_dense.default(aten.all.default(aten.isfinite.default(self))):
            raise RuntimeError("invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    if aten._local_scalar_dense.default(aten.any.default(aten.le.Scalar(aten.sum.dim_IntList(rows, [1]), 0))):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _race(self, n_sample, generator):
    # q = empty_like(self).exponential_(): filled in a dense self's memory order, else contiguously
    if is_non_overlapping_and_dense_or_false(self):
        u = _draw(aten.rand.default, self, torch.float64, generator=generator)
    else:
        u = _fresh(aten.rand.default, list(self.shape), generator, dtype=torch.float64, device=self.device)
    q = aten.neg.default(aten.log1p.default(aten.neg.default(u)))
    if self.dtype != torch.float64:
        q = aten._to_copy.default(q, dtype=self.dtype)
    ratio = aten.div.Tensor(self, q)
    if n_sample == 1:
        return aten.argmax.default(ratio, -1, True)
    return aten.topk.default(ratio, n_sample)[1]


def _cumulative(rows):
    """The kernel's normalized cumulative sums of ``rows`` [b, n], in its precision, last set to 1."""
    b, n = rows.shape
    acc = torch.float64 if rows.dtype == torch.float64 else torch.float32
    rows = rows if rows.dtype == acc else aten._to_copy.default(rows, dtype=acc)
    if acc == torch.float64 or n > SEQUENTIAL_CATEGORIES:
        # NOTE: the CPU cumsum is a sequential sum in float64: the kernel's own for float64
        sums = aten.cumsum.default(rows, 1)
    else:  # float32, one category after another, as the kernel adds them
        column = aten.select.int(rows, 1, 0)
        columns = [column]
        for j in range(1, n):
            column = aten.add.Tensor(column, aten.select.int(rows, 1, j))
            columns.append(column)
        sums = aten.cat.default([aten.unsqueeze.default(c, 1) for c in columns], 1)
    cdf = aten.div.Tensor(sums, aten.slice.Tensor(sums, 1, n - 1, n))
    if n == 1:
        return aten.full_like.default(cdf, 1.0)
    return aten.cat.default(
        [aten.slice.Tensor(cdf, 1, 0, n - 1), aten.full.default([b, 1], 1.0, dtype=acc, device=rows.device)], 1
    )


def _inverse_cdf(self, n_sample, generator):
    rows = self if self.dim() == 2 else aten.unsqueeze.default(self, 0)
    b = rows.shape[0]
    cdf = _cumulative(rows)  # [b, n]
    u = _fresh(aten.rand.default, [b, n_sample], generator, dtype=torch.float64, device=self.device)
    # the binary search's answer: how many cumulative values lie below u
    below = aten.lt.Tensor(aten.unsqueeze.default(cdf, 1), aten.unsqueeze.default(u, 2))  # [b, s, n]
    picks = aten.sum.dim_IntList(below, [2])
    return picks if self.dim() == 2 else aten.squeeze.dim(picks, 0)


@project_decomposition(aten.multinomial.default)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    race = not replacement or num_samples == 1
    _checks(self, num_samples, replacement, race)
    if self.numel() == 0:
        shape = [num_samples] if self.dim() == 1 else [self.shape[0], num_samples]
        return aten.empty.memory_format(shape, dtype=torch.int64, device=self.device)
    picks = _race(self, num_samples, generator) if race else _inverse_cdf(self, num_samples, generator)
    return aten._to_copy.default(picks, dtype=torch.int64) if picks.dtype != torch.int64 else picks
