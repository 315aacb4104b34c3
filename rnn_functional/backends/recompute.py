"""``recompute="full"`` for the eager-loop backend (``reference``).

Time is cut into chunks of about ``sqrt(T)`` steps; every chunk runs under
non-reentrant activation checkpointing, so the forward keeps only the carry at chunk
boundaries and the backward recomputes one chunk's gates at a time. Peak activation
memory drops from ``O(T)`` to ``O(sqrt(T))`` steps; the RNG state is replayed, so the backward's
dropout masks are the forward's (for ``parallel``, whose masks span a layer's whole sequence without
recompute, a chunk draws its own: another draw than ``recompute="none"`` for the same seed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .base import SequenceOptions


def _slice(t, sl: slice):
    if t is None:
        return None
    if isinstance(t, tuple):
        return tuple(s[:, sl] for s in t)
    return t[:, sl]


def checkpointed(impl: Callable) -> Callable:
    """Wrap a backend's ``sequence`` so that its backward recomputes activations chunk by chunk.

    Not for ``scan``: checkpointing around the scan higher-order op is unsupported in
    eager and under compile on torch 2.13; ``scan`` recomputes inside its own backward.
    """

    def sequence(layout, params, x, carry, is_init, reset, opts: SequenceOptions):
        inner = dataclasses.replace(opts, recompute="none")
        if torch.compiler.is_exporting():
            # exported without checkpointing, a memory choice of the backward that leaves every value as it is: strict
            # export fails inside torch on the checkpoint it traces (torch 2.13: KeyError '_checkpoint_context_fn'),
            # and torch refuses it under non-strict tracing from pytorch/pytorch#179021 on
            return impl(layout, params, x, carry, is_init, reset, inner)
        # the tensors of this call, not the mapping: a module's is its child's live parameter dict, which
        # functional_call / to_module restore before the backward recomputes (it then used the wrong weights)
        params = dict(params)
        t_len = x.shape[1]
        chunk = math.isqrt(t_len - 1) + 1
        ys, per_step = [], []
        for t0 in range(0, t_len, chunk):
            sl = slice(t0, t0 + chunk)
            y, carry, states = checkpoint(
                impl, layout, params, x[:, sl], carry, _slice(is_init, sl), _slice(reset, sl), inner,
                use_reentrant=False,
            )
            ys.append(y)
            per_step.append(states)
        states = tuple(torch.cat(parts, dim=1) for parts in zip(*per_step)) if opts.segment_states else None
        return torch.cat(ys, dim=1), carry, states

    return sequence
