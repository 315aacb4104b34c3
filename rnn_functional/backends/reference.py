"""``reference``: a plain eager loop over time of the multi-layer step. The ground truth."""

from __future__ import annotations

import torch

from ..functional._core import Carry, CellSpec, SequenceOptions, apply_reset, keep_segment_ends, multi_layer_step


def sequence(cell: CellSpec, layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, segment states)``; see :mod:`rnn_functional.functional._core`."""
    outputs, states = [], []
    for t in range(x.shape[1]):
        mask = None if is_init is None else is_init[:, t]
        reset_t = None if reset is None else tuple(r[:, t] for r in reset)
        carry = apply_reset(carry, mask, reset_t)
        y, carry = multi_layer_step(cell, layout, params, x[:, t], carry, opts.dropout, opts.training)
        outputs.append(y)
        states.append(carry)
    if not outputs:
        empty = tuple(s.new_zeros(s.shape[0], 0, *s.shape[1:]) for s in carry)
        return x.new_zeros(x.shape[0], 0, layout.out_size), carry, empty if opts.segment_states else None
    seg = None
    if opts.segment_states:
        seg = keep_segment_ends(tuple(torch.stack(parts, dim=1) for parts in zip(*states)), is_init)
    return torch.stack(outputs, dim=1), carry, seg
