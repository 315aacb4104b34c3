"""``recompute="full"`` for the eager-loop backends: chunks of about ``sqrt(T)`` steps under non-reentrant
checkpointing: peak activation memory ``O(sqrt(T))`` steps. The RNG state is replayed: the backward's dropout masks
are the forward's (``parallel``'s chunks each draw their own)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .base import SequenceOptions


def checkpointed(impl: Callable) -> Callable:
    """A backend's ``sequence`` whose backward recomputes chunk by chunk (``scan`` recomputes in its own)."""

    def sequence(layout, params, x, carry, is_init, reset, opts: SequenceOptions):
        inner = dataclasses.replace(opts, recompute="none")
        if torch.compiler.is_exporting():
            # exported without checkpointing (a memory choice, values unchanged): export cannot trace it
            # (KeyError '_checkpoint_context_fn'; refused under non-strict tracing since pytorch/pytorch#179021)
            return impl(layout, params, x, carry, is_init, reset, inner)
        # this call's tensors, not a module's live dict, which functional_call restores before the backward recomputes
        params = dict(params)
        t_len = x.shape[1]
        chunk = math.isqrt(t_len - 1) + 1
        ys, per_step = [], []
        for t0 in range(0, t_len, chunk):
            sl = slice(t0, t0 + chunk)
            mask = None if is_init is None else is_init[:, sl]
            fill = None if reset is None else tuple(r[:, sl] for r in reset)
            y, carry, states = checkpoint(impl, layout, params, x[:, sl], carry, mask, fill, inner, use_reentrant=False)
            ys.append(y)
            per_step.append(states)
        states = tuple(torch.cat(parts, dim=1) for parts in zip(*per_step)) if opts.segment_states else None
        return torch.cat(ys, dim=1), carry, states

    return sequence
