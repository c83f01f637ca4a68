"""The fused LSTM and GRU cells (``nn.LSTM``, ``nn.GRU`` and their cells on a device) in core ops.

NOTE: PyTorch's recurrent layers are CompositeImplicitAutograd; on CUDA, XPU and every
PrivateUse1 backend each time step calls ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``
on the two gate projections, and autograd calls their backwards. PyTorch has no decomposition
for any of the four and the CPU has no kernel for them, so without these decompositions ``nn.LSTM``
could not run on a new device at all. They follow the CUDA kernels (aten/src/ATen/native/cuda/
RNN.cu) step for step, in the kernels' accumulation type (float32 for 16-bit floats), with the
same sums in the same order, and save the same *workspace* for the backward:

* LSTM: the activated gates ``[i, f, g, o]`` (``[N, 4H]``);
* GRU: ``[r, z, n, h, hn + b_hn]`` (``[N, 5H]``): the reset and update gates, the candidate,
  the previous hidden state and the hidden projection of the candidate.

Every result is a fresh contiguous tensor, as the kernels allocate them.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.numerics import to_opmath
from eagerdecomp.decompositions.registry import project_decomposition

aten = torch.ops.aten


def _back(t, dtype):
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, n):
    """The ``n`` gate blocks of ``input + hidden (+ input_bias + hidden_bias)``, summed in the
    kernels' order, for LSTM (``n`` = 4)."""
    gates = aten.add.Tensor(to_opmath(input_gates), to_opmath(hidden_gates))
    if input_bias is not None:
        gates = aten.add.Tensor(aten.add.Tensor(gates, to_opmath(input_bias)), to_opmath(hidden_bias))
    return aten.split.Tensor(gates, gates.shape[1] // n, 1)


def _one_minus(t):
    return aten.rsub.Scalar(t, 1)


@project_decomposition(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dtype = input_gates.dtype
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, g, o = aten.sigmoid.default(i), aten.sigmoid.default(f), aten.tanh.default(g), aten.sigmoid.default(o)
    cy = aten.add.Tensor(aten.mul.Tensor(f, to_opmath(cx)), aten.mul.Tensor(i, g))
    hy = aten.mul.Tensor(o, aten.tanh.default(cy))
    workspace = aten.cat.default([_back(i, dtype), _back(f, dtype), _back(g, dtype), _back(o, dtype)], 1)
    return _back(hy, dtype), _back(cy, dtype), workspace


@project_decomposition(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    dtype = workspace.dtype
    i, f, g, o = aten.split.Tensor(to_opmath(workspace), workspace.shape[1] // 4, 1)
    # NOTE: a missing gradient is zero in the kernel's arithmetic (0 * x + goc), kept as such
    zero = aten.zeros_like.default(cy, dtype=i.dtype)
    go = to_opmath(grad_hy) if grad_hy is not None else zero
    goc = to_opmath(grad_cy) if grad_cy is not None else zero
    t = aten.tanh.default(to_opmath(cy))
    gog = aten.mul.Tensor(go, t)
    gcx = aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(go, o), _one_minus(aten.mul.Tensor(t, t))), goc)
    gig = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(gcx, g), _one_minus(i)), i)
    gfg = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(gcx, to_opmath(cx)), _one_minus(f)), f)
    gcg = aten.mul.Tensor(aten.mul.Tensor(gcx, i), _one_minus(aten.mul.Tensor(g, g)))
    gog = aten.mul.Tensor(aten.mul.Tensor(gog, _one_minus(o)), o)
    grad_gates = aten.cat.default([_back(gig, dtype), _back(gfg, dtype), _back(gcg, dtype), _back(gog, dtype)], 1)
    grad_cx = _back(aten.mul.Tensor(gcx, f), dtype)
    grad_bias = aten.sum.dim_IntList(grad_gates, [0]) if has_bias else None
    return grad_gates, grad_cx, grad_bias


@project_decomposition(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dtype = input_gates.dtype
    h = hx.shape[1]
    ir, ii, in_ = aten.split.Tensor(to_opmath(input_gates), h, 1)
    hr, hi, hn = aten.split.Tensor(to_opmath(hidden_gates), h, 1)
    if input_bias is not None:
        b1r, b1i, b1n = aten.split.Tensor(to_opmath(input_bias), h, 0)
        b2r, b2i, b2n = aten.split.Tensor(to_opmath(hidden_bias), h, 0)
        r = aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(ir, hr), b1r), b2r)
        z = aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(ii, hi), b1i), b2i)
        in_, hn = aten.add.Tensor(in_, b1n), aten.add.Tensor(hn, b2n)
    else:
        r, z = aten.add.Tensor(ir, hr), aten.add.Tensor(ii, hi)
    r, z = aten.sigmoid.default(r), aten.sigmoid.default(z)
    n = aten.tanh.default(aten.add.Tensor(in_, aten.mul.Tensor(r, hn)))
    hy = aten.add.Tensor(n, aten.mul.Tensor(z, aten.sub.Tensor(to_opmath(hx), n)))
    # NOTE: the kernel stores hx itself, not a rounded copy (it is already in hx's dtype)
    workspace = aten.cat.default([_back(r, dtype), _back(z, dtype), _back(n, dtype), hx, _back(hn, dtype)], 1)
    return _back(hy, dtype), workspace


@project_decomposition(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dtype = grad_hy.dtype
    r, z, n, hx, hn = aten.split.Tensor(to_opmath(workspace), grad_hy.shape[1], 1)
    go = to_opmath(grad_hy)
    gz = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(go, aten.sub.Tensor(hx, n)), _one_minus(z)), z)
    ghx = aten.mul.Tensor(go, z)
    gn = aten.mul.Tensor(aten.mul.Tensor(go, _one_minus(z)), _one_minus(aten.mul.Tensor(n, n)))
    ghn = aten.mul.Tensor(gn, r)
    gr = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(gn, hn), _one_minus(r)), r)
    gr, gz = _back(gr, dtype), _back(gz, dtype)
    grad_input_gates = aten.cat.default([gr, gz, _back(gn, dtype)], 1)
    grad_hidden_gates = aten.cat.default([gr, gz, _back(ghn, dtype)], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, _back(ghx, dtype), None, None
    return (
        grad_input_gates,
        grad_hidden_gates,
        _back(ghx, dtype),
        aten.sum.dim_IntList(grad_input_gates, [0]),
        aten.sum.dim_IntList(grad_hidden_gates, [0]),
    )
