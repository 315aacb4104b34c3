"""``reference``: a plain eager loop over time of the multi-layer step. The ground truth."""

from __future__ import annotations

import torch

from ..cells import Carry, Layout, apply_reset, multi_layer_step
from .base import SequenceOptions


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`."""
    outputs, states = [], []
    # one unbind per tensor, not x[:, t] per step: each index's backward zero-fills an [N, T, F] gradient (O(T^2))
    x_t = x.unbind(1)
    masks = (None,) * len(x_t) if is_init is None else is_init.unbind(1)
    resets = (None,) * len(x_t) if reset is None else tuple(zip(*(r.unbind(1) for r in reset)))
    # a cell that reads where segments start gets is_init as each step's start mask [N, 1]
    starts = is_init.unsqueeze(-1).unbind(1) if is_init is not None and layout.cell.reads_starts else (None,) * len(x_t)
    for t in range(len(x_t)):
        carry = apply_reset(carry, masks[t], resets[t])
        y, carry = multi_layer_step(layout, params, x_t[t], carry, opts.dropout, opts.training, starts[t])
        outputs.append(y)
        states.append(carry)
    per_step = tuple([torch.stack(parts, dim=1) for parts in zip(*states)]) if opts.segment_states else None
    return torch.stack(outputs, dim=1), carry, per_step
