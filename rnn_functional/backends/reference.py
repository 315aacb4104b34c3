"""``reference``: a plain eager loop over time of the multi-layer step. The ground truth."""

from __future__ import annotations

import torch

from ..functional._core import Carry, CellSpec, SequenceOptions, apply_reset, multi_layer_step


def sequence(cell: CellSpec, layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry)``; see :mod:`rnn_functional.functional._core`."""
    outputs = []
    for t in range(x.shape[1]):
        mask = None if is_init is None else is_init[:, t]
        reset_t = None if reset is None else tuple(r[:, t] for r in reset)
        carry = apply_reset(carry, mask, reset_t)
        y, carry = multi_layer_step(cell, layout, params, x[:, t], carry, opts.dropout, opts.training)
        outputs.append(y)
    if not outputs:
        return x.new_zeros(x.shape[0], 0, layout.out_size), carry
    return torch.stack(outputs, dim=1), carry
