"""``pad``: ATen's fused kernels of a cell (cuDNN on CUDA, oneDNN/native on CPU).

Serves cells with :class:`~rnn_functional.cells.AtenKernels` (LSTM, GRU). :func:`sequence`
runs a call without interior resets as one kernel call. A call with interior resets is split
into its segments by the functional layer (:mod:`rnn_functional.functional.segments`), which
hands the segments, side by side with their lengths, to :func:`ragged_sequence`: one kernel
call over a ``PackedSequence``, so that each segment's final carry is its own last step.

Both are eager-only (the lengths are host-side counts; ATen's kernels have no vmap rule): the
dispatcher (:func:`rnn_functional.functional.selection.resolve_backend`) routes ``pad`` to
``scan`` under ``torch.compile`` and to ``reference`` under eager ``torch.vmap``.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..cells import AtenKernels, Carry, Layout, apply_reset
from .base import SequenceOptions, no_kernel_for


def aten_kernels(layout: Layout) -> AtenKernels:
    """The cell's ATen kernels; ``ValueError`` naming the backends that can serve it when it has none."""
    if layout.cell.aten is None:
        raise no_kernel_for("pad", layout.cell)
    return layout.cell.aten


def to_layer_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1).contiguous() for s in carry)


def to_batch_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1) for s in carry)


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`.

    Serves resets at ``t = 0`` only (interior resets go through :func:`ragged_sequence`, split by
    the functional layer). The per-step carries hold the final carry at every step.
    """
    if is_init is not None and bool(is_init[:, 1:].any()):
        raise ValueError(
            "backends.pad.sequence runs one kernel call and serves no interior reset; call it through "
            "rnn_functional's public functions (backend='pad'), which split the segments first."
        )
    run = aten_kernels(layout).sequence
    n, t_len = x.shape[0], x.shape[1]
    if is_init is not None:
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple(r[:, 0] for r in reset))
    y, hx = run(layout, params, x, to_layer_major(carry), float(opts.dropout), bool(opts.training), None)
    final = to_batch_major(hx)
    per_step = tuple(s.unsqueeze(1).expand(n, t_len, *s.shape[1:]) for s in final) if opts.segment_states else None
    return y, final, per_step


def ragged_sequence(layout: Layout, params, x, lengths: torch.Tensor, carry: Carry, opts: SequenceOptions):
    """Rows of different lengths, no resets, in one kernel call.

    Args:
        x: ``[S, Lmax, F]``, row ``s`` holding its steps at ``[0, lengths[s])`` (the rest is ignored).
        lengths: ``[S]`` int64 on the CPU, every one in ``[1, Lmax]``.
        carry: tuple of ``[S, L, ·]``, the carry before each row's first step.

    Returns:
        ``(y [S, Lmax, P], final)``: outputs (zeros past each row's length) and, per row, the carry
        after its last step (tuple of ``[S, L, ·]``).
    """
    run = aten_kernels(layout).sequence
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    sorted_h0 = tuple(s.index_select(1, packed.sorted_indices) for s in to_layer_major(carry))
    out_data, hx = run(layout, params, packed.data, sorted_h0, float(opts.dropout), bool(opts.training),
                       packed.batch_sizes)
    y, _ = pad_packed_sequence(packed._replace(data=out_data), batch_first=True, total_length=x.shape[1])
    return y, tuple(s.index_select(1, packed.unsorted_indices).transpose(0, 1) for s in hx)


def step(layout: Layout, params, x: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    """One step over all layers with the cell's fused ATen step (``lstm_cell`` / ``gru_cell``).

    ``x [N, F]``, carry tensors ``[N, L, S]``. Eager only (no vmap rule); no projection.
    """
    run = aten_kernels(layout).step
    new_layers = []
    inp = x
    for k in range(layout.num_layers):
        layer = run(layout.cell.layer_weights(params, layout, k), inp, tuple(s[:, k] for s in carry))
        new_layers.append(layer)
        inp = layer[0]
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*new_layers))
