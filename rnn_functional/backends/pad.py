"""``pad``: ATen's fused kernels of a cell (cuDNN on CUDA, oneDNN/native on CPU).

Serves cells with :class:`~rnn_functional.cells.AtenKernels` (LSTM, GRU). Without an
interior reset the whole sequence is one kernel call. With interior resets, every row is
split into segments at its ``is_init`` positions, the segments are packed
(``PackedSequence``, so that each segment's final state is its own last step) and run in
one kernel call starting from their reset states; outputs are scattered back.

The split needs host-side counts, so this path is eager-only and has no vmap rule: the
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


def _to_layer_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1).contiguous() for s in carry)


def _to_batch_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1) for s in carry)


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`.

    The per-step carries hold, at every step, the final carry of that step's segment.
    """
    run = aten_kernels(layout).sequence
    dropout, training = float(opts.dropout), bool(opts.training)
    n, t_len = x.shape[0], x.shape[1]
    if is_init is not None:
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple(r[:, 0] for r in reset))
    if is_init is None or not bool(is_init[:, 1:].any()):
        y, hx = run(layout, params, x, _to_layer_major(carry), dropout, training, None)
        final = _to_batch_major(hx)
        per_step = tuple(s.unsqueeze(1).expand(n, t_len, *s.shape[1:]) for s in final) if opts.segment_states else None
        return y, final, per_step

    # Split every row into segments that start at t = 0 or at a reset.
    starts = is_init.clone()
    starts[:, 0] = True
    seg_of = starts.reshape(-1).cumsum(0).reshape(n, t_len) - 1  # [N, T] global segment index
    seg_row, seg_t0 = starts.nonzero(as_tuple=True)  # [S]
    pos = torch.arange(t_len, device=x.device).expand(n, t_len) - seg_t0[seg_of]  # step within segment
    lengths_cpu = torch.bincount(seg_of.reshape(-1), minlength=seg_row.shape[0]).cpu()
    max_len = int(lengths_cpu.max())

    padded = x.new_zeros(seg_row.shape[0], max_len, x.shape[-1])
    padded = padded.index_put((seg_of.reshape(-1), pos.reshape(-1)), x.reshape(-1, x.shape[-1]))
    # Initial state of each segment: the incoming carry for segments at t = 0 (already reset
    # above where is_init[:, 0]), the reset state (or zeros) for segments at a reset.
    seg_reset = None if reset is None else tuple(r[seg_row, seg_t0] for r in reset)
    h0 = apply_reset(tuple(s[seg_row] for s in carry), seg_t0 > 0, seg_reset)

    packed = pack_padded_sequence(padded, lengths_cpu, batch_first=True, enforce_sorted=False)
    sorted_h0 = tuple(s.index_select(1, packed.sorted_indices) for s in _to_layer_major(h0))
    out_data, hx = run(layout, params, packed.data, sorted_h0, dropout, training, packed.batch_sizes)
    out, _ = pad_packed_sequence(packed._replace(data=out_data), batch_first=True, total_length=max_len)
    y = out[seg_of, pos]  # [N, T, P]
    seg_final = tuple(s.index_select(1, packed.unsorted_indices).transpose(0, 1) for s in hx)  # [S, L, ·]
    final = tuple(s[seg_of[:, -1]] for s in seg_final)
    per_step = tuple(s[seg_of] for s in seg_final) if opts.segment_states else None
    return y, final, per_step


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
