"""``pad``: ATen's fused LSTM/GRU kernels (cuDNN on CUDA, oneDNN/native on CPU).

Without an interior reset the whole sequence is one kernel call. With interior resets,
every row is split into segments at its ``is_init`` positions, the segments are packed
(``PackedSequence``, so that each segment's final state is its own last step) and run in
one kernel call starting from their reset states; outputs are scattered back.

The split needs host-side counts, so this path is eager-only and has no vmap rule: the
dispatcher (:func:`rnn_functional.backends.resolve_backend`) routes ``pad`` to ``scan``
under ``torch.compile`` and to ``reference`` under eager ``torch.vmap``.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._layout import layer_weights
from ..functional._core import Carry, CellSpec, SequenceOptions, apply_reset


def _flat_weights(layout, params) -> list[torch.Tensor]:
    flat = []
    for k in range(layout.num_layers):
        w = layer_weights(params, layout, k)
        flat += [w.weight_ih, w.weight_hh]
        if layout.bias:
            flat += [w.bias_ih, w.bias_hh]
        if w.weight_hr is not None:
            flat.append(w.weight_hr)
    return flat


def _kernel(cell: CellSpec, layout, params, inputs, hx: Carry, opts: SequenceOptions, batch_sizes=None):
    """Call ``_VF.lstm`` / ``_VF.gru``; ``hx`` tensors are ``[L, S, ·]``. Returns ``(out, hx')``."""
    fn = torch._VF.lstm if cell.name == "lstm" else torch._VF.gru
    hx_arg = hx if cell.name == "lstm" else hx[0]
    args = (_flat_weights(layout, params), layout.bias, layout.num_layers, float(opts.dropout), bool(opts.training), False)
    if batch_sizes is None:
        out = fn(inputs, hx_arg, *args, True)
    else:
        out = fn(inputs, batch_sizes, hx_arg, *args)
    return out[0], tuple(out[1:])


def _to_layer_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1).contiguous() for s in carry)


def _to_batch_major(carry: Carry) -> Carry:
    return tuple(s.transpose(0, 1) for s in carry)


def sequence(cell: CellSpec, layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, segment states)``; see :mod:`rnn_functional.functional._core`."""
    n, t_len = x.shape[0], x.shape[1]
    if t_len == 0 or n == 0:
        seg = tuple(s.new_zeros(n, t_len, *s.shape[1:]) for s in carry) if opts.segment_states else None
        return x.new_zeros(n, t_len, layout.out_size), carry, seg
    if is_init is not None:
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple(r[:, 0] for r in reset))
    if is_init is None or not bool(is_init[:, 1:].any()):
        y, hx = _kernel(cell, layout, params, x, _to_layer_major(carry), opts)
        final = _to_batch_major(hx)
        seg = None
        if opts.segment_states:  # one segment per row: its end is the last step
            seg = tuple(torch.cat([s.new_zeros(n, t_len - 1, *s.shape[1:]), s.unsqueeze(1)], dim=1) for s in final)
        return y, final, seg

    # Split every row into segments that start at t = 0 or at a reset.
    starts = is_init.clone()
    starts[:, 0] = True
    seg_of = starts.reshape(-1).cumsum(0).reshape(n, t_len) - 1  # [N, T] global segment index
    seg_row, seg_t0 = starts.nonzero(as_tuple=True)  # [S]
    pos = torch.arange(t_len, device=x.device).expand(n, t_len) - seg_t0[seg_of]  # step within segment
    lengths = torch.bincount(seg_of.reshape(-1), minlength=seg_row.shape[0])
    lengths_cpu = lengths.cpu()
    max_len = int(lengths_cpu.max())

    padded = x.new_zeros(seg_row.shape[0], max_len, x.shape[-1])
    padded = padded.index_put((seg_of.reshape(-1), pos.reshape(-1)), x.reshape(-1, x.shape[-1]))
    # Initial state of each segment: the incoming carry for segments at t = 0 (already reset
    # above where is_init[:, 0]), the reset state (or zeros) for segments at a reset.
    seg_is_reset = seg_t0 > 0
    seg_reset = None if reset is None else tuple(r[seg_row, seg_t0] for r in reset)
    h0 = apply_reset(tuple(s[seg_row] for s in carry), seg_is_reset, seg_reset)

    packed = pack_padded_sequence(padded, lengths_cpu, batch_first=True, enforce_sorted=False)
    sorted_h0 = tuple(s.index_select(1, packed.sorted_indices) for s in _to_layer_major(h0))
    out_data, hx = _kernel(cell, layout, params, packed.data, sorted_h0, opts, packed.batch_sizes)
    out, _ = pad_packed_sequence(
        packed._replace(data=out_data), batch_first=True, total_length=max_len
    )
    y = out[seg_of, pos]  # [N, T, P]
    hx = tuple(s.index_select(1, packed.unsorted_indices).transpose(0, 1) for s in hx)  # [S, L, ·]
    final = tuple(s[seg_of[:, -1]] for s in hx)
    seg = None
    if opts.segment_states:  # each segment's final carry at its last step
        seg_end = seg_t0 + lengths - 1
        seg = tuple(
            s.new_zeros(n, t_len, *s.shape[1:]).index_put((seg_row, seg_end), s) for s in hx
        )
    return y, final, seg


def step(cell: CellSpec, layout, params, x: torch.Tensor, carry: Carry) -> tuple[torch.Tensor, Carry]:
    """One step over all layers with ATen's fused cells (``lstm_cell`` / ``gru_cell``).

    ``x [N, F]``, carry tensors ``[N, L, S]``. Eager only (no vmap rule); no projection.
    """
    new_layers = []
    inp = x
    for k in range(layout.num_layers):
        w = layer_weights(params, layout, k)
        if cell.name == "lstm":
            layer = torch._VF.lstm_cell(inp, (carry[0][:, k], carry[1][:, k]), w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh)
        else:
            layer = (torch._VF.gru_cell(inp, carry[0][:, k], w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh),)
        new_layers.append(layer)
        inp = layer[0]
    return inp, tuple(torch.stack(parts, dim=1) for parts in zip(*new_layers))
