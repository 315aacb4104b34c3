"""``recompute="full"`` for the eager-loop backend (``reference``).

Time is cut into chunks of about ``sqrt(T)`` steps; every chunk runs under
non-reentrant activation checkpointing, so the forward keeps only the carry at chunk
boundaries and the backward recomputes one chunk's gates at a time. Peak activation
memory drops from ``O(T)`` to ``O(sqrt(T))`` steps; the RNG state is replayed, so dropout
masks match.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ..functional._core import SequenceOptions, keep_segment_ends


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

    def sequence(cell, layout, params, x, carry, is_init, reset, opts: SequenceOptions):
        inner = dataclasses.replace(opts, recompute="none")
        t_len = x.shape[1]
        chunk = max(1, math.isqrt(max(t_len - 1, 0)) + 1)
        ys, segs = [], []
        for t0 in range(0, t_len, chunk):
            sl = slice(t0, t0 + chunk)
            y, carry, seg = checkpoint(
                impl, cell, layout, params, x[:, sl], carry, _slice(is_init, sl), _slice(reset, sl), inner,
                use_reentrant=False,
            )
            ys.append(y)
            segs.append(seg)
        if not ys:
            return impl(cell, layout, params, x, carry, is_init, reset, inner)
        seg = None
        if opts.segment_states:  # a chunk's last step ends a segment only if the sequence says so
            seg = keep_segment_ends(tuple(torch.cat(parts, dim=1) for parts in zip(*segs)), is_init)
        return torch.cat(ys, dim=1), carry, seg

    return sequence
