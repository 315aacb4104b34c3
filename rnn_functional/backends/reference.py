"""``reference``: a plain eager loop over time of the multi-layer step. The ground truth."""

from __future__ import annotations

import torch

from ..cells import Carry, Layout, apply_reset, multi_layer_step
from .base import SequenceOptions


def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
    """``x [N, T, F]`` -> ``(y [N, T, P], carry, per-step carries)``; see :mod:`.base`."""
    outputs, states = [], []
    for t in range(x.shape[1]):
        mask = None if is_init is None else is_init[:, t]
        reset_t = None if reset is None else tuple(r[:, t] for r in reset)
        carry = apply_reset(carry, mask, reset_t)
        y, carry = multi_layer_step(layout, params, x[:, t], carry, opts.dropout, opts.training)
        outputs.append(y)
        states.append(carry)
    per_step = tuple(torch.stack(parts, dim=1) for parts in zip(*states)) if opts.segment_states else None
    return torch.stack(outputs, dim=1), carry, per_step
