"""Segment-aware execution: a call re-batched by its segments, for any backend.

A *segment* is a maximal run of steps of one row between resets: it starts at ``t = 0`` or
where ``is_init`` is True and ends before the next reset or at ``T - 1``. No state crosses a
reset, so the segments of every row are independent sequences: each starts from its own
initial carry (the incoming carry, reset where ``is_init[:, 0]``, for a segment at ``t = 0``;
``reset_state`` at its first step, or zeros, for the others). Re-batched, a call of ``N`` rows
of ``T`` steps becomes ``S`` rows (one per segment) of at most ``Lmax`` steps (the longest
segment) with no interior reset: a flat ``SliceSampler`` batch ``[1, N]`` runs its slices side
by side instead of ``N`` steps of one row.

Two schemes, both exact:

* :func:`aligned`, for any backend's canonical ``sequence``: the segments are right-aligned in an
  ``[S, Lmax]`` block (front padding) and each segment's first real step is marked as a reset to
  its initial carry. Every segment then ends at the block's last step: its final carry is the
  backend's final carry. The padded steps compute values that the reset discards.
* :func:`packed`, for the ``pad`` backend: the segments are left-aligned with their lengths and
  run by ATen's kernels as one packed sequence (:func:`rnn_functional.backends.pad.ragged_sequence`).

Segment counts and lengths are data-dependent host values: both are eager-only (the selection
layer never re-batches under ``torch.compile`` or ``torch.func`` transforms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backends import SequenceOptions, pad
from ..cells import Carry, Layout, apply_reset


@dataclass(frozen=True)
class SegmentPlan:
    """Where the segments of an ``[N, T]`` call lie (``S`` segments, the longest ``max_len`` steps).

    ``seg_of [N, T]`` and ``pos [N, T]``: each step's segment and its index within it; ``row [S]``
    and ``start [S]``: each segment's row and first step; ``lengths [S]`` (on the device) and
    ``lengths_cpu [S]``: their step counts.
    """

    seg_of: torch.Tensor
    pos: torch.Tensor
    row: torch.Tensor
    start: torch.Tensor
    lengths: torch.Tensor
    lengths_cpu: torch.Tensor
    max_len: int

    @property
    def count(self) -> int:
        """``S``, the number of segments."""
        return int(self.row.shape[0])


def plan(is_init: torch.Tensor) -> SegmentPlan:
    """The segments of a call with resets ``is_init [N, T]`` (bool, ``N, T > 0``); syncs with the host."""
    n, t_len = is_init.shape
    starts = is_init.clone()
    starts[:, 0] = True
    seg_of = starts.reshape(-1).cumsum(0).reshape(n, t_len) - 1
    row, start = starts.nonzero(as_tuple=True)
    pos = torch.arange(t_len, device=is_init.device).expand(n, t_len) - start[seg_of]
    lengths = torch.bincount(seg_of.reshape(-1), minlength=row.shape[0])
    lengths_cpu = lengths.cpu()
    return SegmentPlan(seg_of, pos, row, start, lengths, lengths_cpu, int(lengths_cpu.max()))


def _initial_carries(p: SegmentPlan, carry: Carry, is_init: torch.Tensor, reset: Carry | None) -> Carry:
    """Every segment's carry before its first step: tuple of ``[S, L, ·]``."""
    carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple(r[:, 0] for r in reset))
    seg_reset = None if reset is None else tuple(r[p.row, p.start] for r in reset)
    return apply_reset(tuple(s[p.row] for s in carry), p.start > 0, seg_reset)


def _scatter(p: SegmentPlan, y_block: torch.Tensor, col: torch.Tensor, seg_final: Carry, opts: SequenceOptions):
    """Block results back to the call's rows: ``(y [N, T, P], carry_T, per-step carries)``.

    ``col [N, T]`` is each step's column in ``y_block [S, Lmax, P]``; the per-step carries
    hold, at every step, the final carry of its segment (exact at every segment end).
    """
    y = y_block[p.seg_of, col]
    final = tuple(s[p.seg_of[:, -1]] for s in seg_final)
    per_step = tuple(s[p.seg_of] for s in seg_final) if opts.segment_states else None
    return y, final, per_step


def _block(p: SegmentPlan, x: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``x [N, T, F]`` laid out as ``[S, Lmax, F]``: step ``(n, t)`` at ``(seg_of, col)``, zeros elsewhere."""
    block = x.new_zeros(p.count, p.max_len, x.shape[-1])
    return block.index_put((p.seg_of.reshape(-1), col.reshape(-1)), x.reshape(-1, x.shape[-1]))


def aligned(impl: Callable, p: SegmentPlan) -> Callable:
    """``impl`` (a backend's canonical ``sequence``) run on the right-aligned segments of ``p``."""

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        offset = p.max_len - p.lengths  # [S] front padding of each segment
        col = p.pos + offset[p.seg_of]
        h0 = _initial_carries(p, carry, is_init, reset)
        first = torch.zeros(p.count, p.max_len, dtype=torch.bool, device=x.device)
        first[torch.arange(p.count, device=x.device), offset] = True
        to_h0 = tuple(s.unsqueeze(1).expand(s.shape[0], p.max_len, *s.shape[1:]) for s in h0)
        inner = dataclasses.replace(opts, segment_states=False)
        y_block, seg_final, _ = impl(layout, params, _block(p, x, col), h0, first, to_h0, inner)
        return _scatter(p, y_block, col, seg_final, opts)

    sequence.__qualname__ = f"aligned({getattr(impl, '__qualname__', impl)})"
    return sequence


def packed(p: SegmentPlan) -> Callable:
    """The ``pad`` backend run on the left-aligned segments of ``p``, packed by their lengths."""

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        h0 = _initial_carries(p, carry, is_init, reset)
        y_block, seg_final = pad.ragged_sequence(layout, params, _block(p, x, p.pos), p.lengths_cpu, h0, opts)
        return _scatter(p, y_block, p.pos, seg_final, opts)

    return sequence
