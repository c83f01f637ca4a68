"""CTC loss (speech models' training heads: Wav2Vec2ForCTC, HuBERT, ...) in core ops, and
nll_loss's uint8 targets.

NOTE: no decomposition in PyTorch. The forward is the CPU kernel's alpha recursion over
time, vectorized over the batch and the extended target (blanks interleaved with the
labels), with the kernel's log-sum-exp (max taken out, -inf max replaced by 0); the
backward runs the beta recursion and combines both as the kernel does. Lengths are
Python ints here (the .Tensor overloads read them, so they run on the bypass path).
Entries of log_alpha the kernel never writes (past a sample's input or target length)
are -inf here. Sums over classes run in another order than the kernel's: results agree
to rounding.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten
_NEG_INF = float("-inf")


def _const(values, like, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=like.device)


def _extended(targets, target_lengths, blank, n, max_tl):
    """``[N, 2*max_tl+1]`` int64: blank, l1, blank, l2, ..., blank (padded with blanks)."""
    device = targets.device
    if max_tl == 0:
        return aten.full.default([n, 1], blank, dtype=torch.int64, device=device)
    if targets.dim() == 2:
        labels = aten.slice.Tensor(targets, 1, 0, max_tl)
    else:  # concatenated targets: positions of each sample's labels (clamped inside its span)
        starts, pos = 0, []
        for tl in target_lengths:
            pos.append([starts + min(j, max(tl - 1, 0)) for j in range(max_tl)])
            starts += tl
        labels = (
            aten.index.Tensor(targets, [_const(pos, targets)])
            if targets.shape[0]
            else aten.full.default([n, max_tl], blank, dtype=torch.int64, device=device)
        )
    labels = aten._to_copy.default(labels, dtype=torch.int64)
    blanks = aten.full.default([n, max_tl], blank, dtype=torch.int64, device=device)
    pairs = aten.view.default(aten.stack.default([blanks, labels], 2), [n, 2 * max_tl])
    return aten.cat.default([pairs, aten.full.default([n, 1], blank, dtype=torch.int64, device=device)], 1)


def _lse3(a, b, c):
    m = aten.maximum.default(aten.maximum.default(a, b), c)
    m = aten.where.self(aten.eq.Scalar(m, _NEG_INF), aten.full_like.default(m, 0), m)
    total = aten.add.Tensor(
        aten.add.Tensor(aten.exp.default(aten.sub.Tensor(a, m)), aten.exp.default(aten.sub.Tensor(b, m))),
        aten.exp.default(aten.sub.Tensor(c, m)),
    )
    return aten.add.Tensor(aten.log.default(total), m)


def _shift(x, k):
    """``x[:, s - k]`` along dim 1 (``-inf`` where ``s - k`` is out of range); ``k`` may be negative."""
    n, width = x.shape
    if abs(k) >= width:  # every position shifted out (an all-blank target has width 1)
        return aten.full.default([n, width], _NEG_INF, dtype=x.dtype, device=x.device)
    pad = aten.full.default([n, abs(k)], _NEG_INF, dtype=x.dtype, device=x.device)
    if k > 0:
        return aten.cat.default([pad, aten.slice.Tensor(x, 1, 0, width - k)], 1)
    return aten.cat.default([aten.slice.Tensor(x, 1, -k, width), pad], 1)


def _setup(log_probs, targets, input_lengths, target_lengths, blank):
    T, n, _ = log_probs.shape
    max_tl = max(target_lengths) if len(target_lengths) else 0
    ext = _extended(targets, target_lengths, blank, n, max_tl)
    width = ext.shape[1]
    # lp[t, b, s] = log_probs[t, b, ext[b, s]]
    lp = aten.gather.default(log_probs, 2, aten.expand.default(aten.unsqueeze.default(ext, 0), [T, n, width]))
    skip = aten.ne.Tensor(ext, _shift_int(ext, 2))  # s - 2 may be skipped into s
    s_idx = aten.arange.default(width, device=log_probs.device)
    valid = aten.lt.Tensor(
        aten.unsqueeze.default(s_idx, 0),
        aten.unsqueeze.default(_const([2 * tl + 1 for tl in target_lengths], log_probs), 1),
    )
    return T, n, width, ext, lp, skip, valid


def _shift_int(ext, k):
    if k >= ext.shape[1]:
        return aten.full.default(list(ext.shape), -1, dtype=ext.dtype, device=ext.device)
    pad = aten.full.default([ext.shape[0], k], -1, dtype=ext.dtype, device=ext.device)
    return aten.cat.default([pad, aten.slice.Tensor(ext, 1, 0, ext.shape[1] - k)], 1)


def _alphas(log_probs, targets, input_lengths, target_lengths, blank):
    T, n, width, ext, lp, skip, valid = _setup(log_probs, targets, input_lengths, target_lengths, blank)
    neg = aten.full.default([n, width], _NEG_INF, dtype=log_probs.dtype, device=log_probs.device)
    first = aten.lt.Tensor(
        aten.unsqueeze.default(aten.arange.default(width, device=log_probs.device), 0),
        aten.unsqueeze.default(_const([min(2, 2 * tl + 1) for tl in target_lengths], log_probs), 1),
    )
    alpha = aten.where.self(first, aten.select.int(lp, 0, 0), neg)
    rows = [alpha]
    for t in range(1, T):
        a3 = aten.where.self(skip, _shift(alpha, 2), neg)
        nxt = aten.add.Tensor(_lse3(alpha, _shift(alpha, 1), a3), aten.select.int(lp, 0, t))
        nxt = aten.where.self(valid, nxt, neg)
        live = aten.unsqueeze.default(_const([t < il for il in input_lengths], log_probs, torch.bool), 1)
        alpha = aten.where.self(live, nxt, alpha)  # finished samples carry their last alpha on
        rows.append(aten.where.self(live, nxt, neg))
    return aten.stack.default(rows, 1), ext, lp, skip, valid  # [N, T, width]


def _check(log_probs, input_lengths, target_lengths):
    if log_probs.dim() != 3 or log_probs.dtype not in (torch.float32, torch.float64):
        return False
    return all(0 < il <= log_probs.shape[0] for il in input_lengths) and all(tl >= 0 for tl in target_lengths)


def _nll(log_alpha, input_lengths, target_lengths):
    n = log_alpha.shape[0]
    last = aten.index.Tensor(
        log_alpha,
        [aten.arange.default(n, device=log_alpha.device), _const([il - 1 for il in input_lengths], log_alpha)],
    )
    end = aten.gather.default(last, 1, aten.unsqueeze.default(_const([2 * tl for tl in target_lengths], log_alpha), 1))
    before = aten.gather.default(
        last, 1, aten.unsqueeze.default(_const([max(2 * tl - 1, 0) for tl in target_lengths], log_alpha), 1)
    )
    neg = aten.full_like.default(end, _NEG_INF)
    before = aten.where.self(
        aten.unsqueeze.default(_const([tl > 0 for tl in target_lengths], log_alpha, torch.bool), 1), before, neg
    )
    # NOTE: an impossible alignment stays inf even with zero_infinity, as the kernel returns it
    # (ctc_loss zeroes it afterwards; the backward zeroes its gradient)
    return aten.neg.default(aten.squeeze.dim(_lse3(end, before, neg), 1))


@project_decomposition(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    input_lengths, target_lengths = list(input_lengths), list(target_lengths)
    if not _check(log_probs, input_lengths, target_lengths):
        return NotImplemented  # eager's argument errors come from its own checks
    log_alpha = _alphas(log_probs, targets, input_lengths, target_lengths, blank)[0]
    return _nll(log_alpha, input_lengths, target_lengths), log_alpha


def _ints(t):
    return [int(v) for v in t.tolist()] if isinstance(t, torch.Tensor) else list(t)


@project_decomposition(aten._ctc_loss.Tensor)
def ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return ctc_loss(log_probs, targets, _ints(input_lengths), _ints(target_lengths), blank, zero_infinity)


@project_decomposition(aten._ctc_loss_backward.default)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity=False
):
    input_lengths, target_lengths = list(input_lengths), list(target_lengths)
    if not _check(log_probs, input_lengths, target_lengths):
        return NotImplemented
    T, n, C = log_probs.shape
    _, _, width, ext, lp, skip, valid = _setup(log_probs, targets, input_lengths, target_lengths, blank)
    neg = aten.full.default([n, width], _NEG_INF, dtype=log_probs.dtype, device=log_probs.device)
    # beta at each sample's last step: the final blank and the final label
    s_idx = aten.unsqueeze.default(aten.arange.default(width, device=log_probs.device), 0)
    ends = aten.unsqueeze.default(_const([2 * tl for tl in target_lengths], log_probs), 1)
    at_end = aten.logical_and.default(aten.le.Tensor(s_idx, ends), aten.ge.Tensor(s_idx, aten.sub.Tensor(ends, 1)))
    skip_back = aten.ne.Tensor(ext, _shift_back_int(ext))
    beta, rows = neg, [None] * T
    for t in range(T - 1, -1, -1):
        step = aten.select.int(lp, 0, t)
        start = aten.where.self(at_end, step, neg)
        b3 = aten.where.self(skip_back, _shift(beta, -2), neg)
        rec = aten.where.self(valid, aten.add.Tensor(_lse3(beta, _shift(beta, -1), b3), step), neg)
        last = aten.unsqueeze.default(_const([t == il - 1 for il in input_lengths], log_probs, torch.bool), 1)
        live = aten.unsqueeze.default(_const([t < il - 1 for il in input_lengths], log_probs, torch.bool), 1)
        beta = aten.where.self(last, start, aten.where.self(live, rec, neg))
        rows[t] = beta
    log_beta = aten.stack.default(rows, 1)  # [N, T, width]
    ab = aten.add.Tensor(log_alpha, log_beta)
    m = aten.amax.default(ab, [2], True)
    m = aten.where.self(aten.eq.Scalar(m, _NEG_INF), aten.full_like.default(m, 0), m)
    index = aten.expand.default(aten.unsqueeze.default(ext, 1), [n, T, width])
    sums = aten.scatter_add.default(
        aten.full.default([n, T, C], 0, dtype=log_probs.dtype, device=log_probs.device),
        2,
        index,
        aten.exp.default(aten.sub.Tensor(ab, m)),
    )
    lcab = aten.add.Tensor(aten.log.default(sums), m)  # -inf for classes no path visits
    lp_bt = aten.permute.default(log_probs, [1, 0, 2])
    nll = aten.view.default(neg_log_likelihood, [n, 1, 1])
    res = aten.sub.Tensor(aten.exp.default(lp_bt), aten.exp.default(aten.sub.Tensor(aten.add.Tensor(lcab, nll), lp_bt)))
    res = aten.mul.Tensor(res, aten.view.default(grad, [n, 1, 1]) if grad.dim() else grad)
    t_idx = aten.unsqueeze.default(aten.arange.default(T, device=log_probs.device), 0)
    keep = aten.lt.Tensor(t_idx, aten.unsqueeze.default(_const(input_lengths, log_probs), 1))  # [N, T]
    if zero_infinity:
        keep = aten.logical_and.default(
            keep, aten.unsqueeze.default(aten.ne.Scalar(neg_log_likelihood, float("inf")), 1)
        )
    res = aten.where.self(aten.unsqueeze.default(keep, 2), res, aten.full_like.default(res, 0))
    return aten.permute.default(res, [1, 0, 2])


def _shift_back_int(ext):
    if ext.shape[1] <= 2:
        return aten.full.default(list(ext.shape), -1, dtype=ext.dtype, device=ext.device)
    pad = aten.full.default([ext.shape[0], 2], -1, dtype=ext.dtype, device=ext.device)
    return aten.cat.default([aten.slice.Tensor(ext, 1, 2, ext.shape[1]), pad], 1)


@project_decomposition(aten._ctc_loss_backward.Tensor)
def ctc_loss_backward_tensor(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity=False
):
    return ctc_loss_backward(
        grad,
        log_probs,
        targets,
        _ints(input_lengths),
        _ints(target_lengths),
        neg_log_likelihood,
        log_alpha,
        blank,
        zero_infinity,
    )


# NOTE: nll_loss's kernel takes uint8 class indices as well as int64 ones; PyTorch's
# decomposition gathers with the target, and gather takes int64 only. The same, widened.
# NOTE: eager's kernels check every target that is not ignore_index against the class count and
# raise IndexError ("Target 7 is out of bounds.", a label bug in a training script); PyTorch's
# decomposition gathers with the target, and gather's own check raises RuntimeError. Indexing an
# arange of the classes with the target is the identity where eager's check passes and raises
# IndexError where it fails (negative targets sent past the end first: index would wrap them), on
# every call, without reading the target in Python.
def _checked_target(target, n_classes: int, ignore_index: int):
    kept = aten.ne.Scalar(target, ignore_index)
    past_end = aten.full_like.default(target, n_classes)
    checked = aten.where.self(aten.lt.Scalar(target, 0), past_end, target)
    checked = aten.where.self(kept, checked, aten.zeros_like.default(target))
    classes = aten.arange.default(n_classes, dtype=target.dtype, device=target.device)
    return aten.where.self(kept, aten.index.Tensor(classes, [checked]), target)


def _nll_decomposition(op):
    import torch._decomp

    inner = torch._decomp.decomposition_table[op]
    at = 2 if op is aten.nll_loss_backward.default else 1  # (grad, self, target...) / (self, target...)

    def nll(*args, **kwargs):
        args = list(args)
        if args[at].dtype == torch.uint8 and op is not aten.nll_loss2d_forward.default:
            args[at] = aten._to_copy.default(args[at], dtype=torch.int64)
        if op is not aten.nll_loss_backward.default:  # (a backward follows a checked forward)
            ignore_index = args[4] if len(args) > 4 else kwargs["ignore_index"]
            n_classes = args[0].shape[1 if args[0].dim() > 1 else 0]
            args[at] = _checked_target(args[at], n_classes, ignore_index)
        return inner(*args, **kwargs)

    return nll


for _op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, aten.nll_loss_backward.default):
    project_decomposition(_op)(_nll_decomposition(_op))
