"""Packed sequences (``nn.utils.rnn.pack_padded_sequence``) in core ops.

NOTE: ``_pack_padded_sequence`` has only a CompositeExplicitAutograd kernel, which a dispatch mode
never reaches, and no decomposition in PyTorch. Its backward (``_pack_padded_sequence_backward``)
and ``pad_packed_sequence``'s op (``_pad_packed_sequence``) are CompositeImplicitAutograd: they
reach the mode as the slices, copies and cats they call, so only the forward needs an entry.

Its output depends on the values of ``lengths`` (a CPU int64 tensor): the number of rows packed
and ``batch_sizes``. Read while tracing, they stop the trace (fake tensors hold no values), so
every call decomposes eagerly (the runtime's remembered bypass), never from a kernel traced for
other lengths. The steps follow ATen's kernel (aten/src/ATen/native/PackedSequence.cpp): its
checks with its messages, then one block per distinct length, each a contiguous slice of the
time-major input, concatenated; ``batch_sizes`` is a new tensor on ``lengths``' device.
"""

from __future__ import annotations

import torch

from eagerdecomp.decompositions.registry import project_decomposition
from eagerdecomp.ops.checks import scalar_type_name

aten = torch.ops.aten


def _check_lengths(lengths):
    if lengths.dim() != 1 or lengths.device.type != "cpu" or lengths.dtype != torch.int64:
        kind = scalar_type_name(lengths.dtype)  # as ATen names it ("Int", "Long")
        raise RuntimeError(
            "'lengths' argument should be a 1D CPU int64 tensor, "
            f"but got {lengths.dim()}D {lengths.device} {kind} tensor"
        )


@project_decomposition(aten._pack_padded_sequence.default)
def pack_padded_sequence(input, lengths, batch_first):
    if input.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    if batch_first:
        input = aten.transpose.int(input, 0, 1)
    _check_lengths(lengths)
    batch = input.shape[1]
    values = lengths.tolist()  # data values: eager decomposition, never a traced kernel
    if len(values) != batch:
        raise RuntimeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {len(values)} (batch_size={batch})"
        )
    if values[-1] <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0"
        )
    if any(values[i + 1] > values[i] for i in range(batch - 1)):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can pass "
            "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this requirement "
            "if you do not need ONNX exportability."
        )
    step_shape = [-1] + list(input.shape[2:])
    steps, batch_sizes, prev = [], [], 0
    for i in range(batch):  # from the shortest sequence: one block each time the length grows
        length = values[batch - 1 - i]
        if length > prev:
            current = batch - i
            block = aten.slice.Tensor(aten.slice.Tensor(input, 0, prev, length), 1, 0, current)
            if not block.is_contiguous():
                block = aten.clone.default(block, memory_format=torch.contiguous_format)
            steps.append(aten.view.default(block, step_shape))
            batch_sizes += [current] * (length - prev)
            prev = length
    return aten.cat.default(steps), torch.tensor(batch_sizes, dtype=torch.int64)  # on the CPU, as lengths
