"""How a call runs: the :class:`Route` the functional layer picks (a backend, and how a call with interior resets
lays out its *segments*, the runs of steps between resets, as ``S`` independent rows of at most ``Lmax`` steps), and
those layouts (``docs/backends.md``, "Segment layouts"). Counts and lengths come from the call's one host read of its
mask (:func:`plan`); under ``torch.compile`` the one layout is ``aligned`` over a :func:`static_plan`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ..cells import Carry, Layout, apply_reset
from . import pad, parallel, reference, scan
from . import triton as triton_backend
from .base import SequenceOptions
from .recompute import checkpointed

SEGMENT_LAYOUTS = ("rows", "aligned", "packed", "buckets", "slices")
LAYOUTS_OF = {"reference": ("rows", "aligned"), "scan": ("rows", "aligned"), "pad": ("packed", "buckets", "slices"),
              "triton": ("rows",), "parallel": ("rows",)}  # the layouts each runs a call with interior resets in
_SEQUENCES = {"reference": reference.sequence, "parallel": parallel.sequence, "scan": scan.sequence,
              "pad": pad.sequence, "triton": triton_backend.sequence}
_CHECKPOINTED = ("reference", "parallel")  # recompute="full" by activation checkpointing; scan and triton serve it


class Result(NamedTuple):
    """``y [N, T, P]``, the ``final`` carry, the ``per_step`` carries ``[N, T, L, ·]`` (with ``opts.segment_states``)
    and whether those are the segment-end states already (zeros elsewhere)."""

    y: torch.Tensor
    final: Carry
    per_step: Carry | None
    segment_ends: bool = False


@dataclass
class SegmentPlan:
    """Where the segments of an ``[N, T]`` call lie: ``count`` segments, the longest ``max_len`` steps.

    On the device: ``first [S]`` (each segment's first step, row-major over ``N * T``), ``lengths [S]``, ``last [N]``
    (the segment ending each row). NumPy, from the host read: ``lengths_host``, ``order`` (by decreasing length,
    stable), its inverse ``rank``. ``slice_len``: ``L`` when every row is whole slices of ``L < T`` steps from
    ``t = 0``, else ``None``. :meth:`positions` are derived on first use. ``static``: a :func:`static_plan` (no host
    values)."""

    shape: tuple[int, int]
    first: torch.Tensor
    lengths: torch.Tensor
    last: torch.Tensor
    lengths_host: np.ndarray | None
    max_len: int
    count: int
    slice_len: int | None = None
    order: np.ndarray | None = None
    rank: np.ndarray | None = None
    index: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    static: bool = False

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seg_of, pos)``, ``[N, T]`` each: each step's segment and its index in it."""
        if self.index is None:
            n, t_len = self.shape
            seg_of = torch.repeat_interleave(self.lengths, output_size=n * t_len)  # segment s repeated lengths[s] times
            pos = torch.arange(n * t_len, device=seg_of.device) - self.first[seg_of]
            self.index = (seg_of.view(n, t_len), pos.view(n, t_len))
        return self.index


def segment_starts(is_init: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, lengths)``: every segment's first step (row-major flat index) and step count, of ``is_init [N, T]``
    (a bool NumPy array; a row's first step starts a segment)."""
    starts = is_init.copy()
    starts[:, 0] = True
    first = np.flatnonzero(starts)
    return first, np.diff(first, append=starts.size)


def plan(is_init: np.ndarray, device: torch.device) -> SegmentPlan | None:
    """The segments of ``is_init [N, T]`` (a bool NumPy array), ``None`` without interior resets."""
    (n, t_len) = is_init.shape
    if t_len < 2 or not is_init[:, 1:].any():
        return None
    first, lengths = segment_starts(is_init)
    length = int(lengths[0])
    # every row whole slices of one length from t = 0: its starts are every multiple of the length, and no others
    regular = length < t_len and len(first) == n * -(-t_len // length) and not (first % t_len % length).any()
    last = np.searchsorted(first, np.arange(1, n + 1) * t_len) - 1
    order = np.argsort(-lengths, kind="stable")
    rank = np.argsort(order)  # the inverse permutation
    return SegmentPlan(is_init.shape, _to(first, device), _to(lengths, device), _to(last, device), lengths,
                       int(lengths.max()), len(first), length if regular else None, order, rank)


def _to(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as an int64 tensor on ``device``; to CUDA through pinned memory (a pageable copy syncs the stream)."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def segment_index(is_init: torch.Tensor) -> torch.Tensor:
    """``[N * T]`` int64: each step's segment of ``is_init [N, T]`` (row-major; a row's first step starts one)."""
    starts = is_init.clone()
    starts[:, 0] = True
    return starts.reshape(-1).cumsum(0) - 1


def segment_lengths(seg_of: torch.Tensor, bound: int) -> torch.Tensor:
    """``[bound]``: the step counts of the first ``bound`` segments of :func:`segment_index`, zeros past the last."""
    seg_of = seg_of.clamp(max=bound - 1)
    return seg_of.new_zeros(bound).scatter_add(0, seg_of, torch.ones_like(seg_of))


def static_plan(is_init: torch.Tensor, slice_len: int, num_slices: int) -> SegmentPlan:
    """The segments of ``is_init [N, T]`` in a ``[num_slices, slice_len]`` block, from static shapes only (under
    ``torch.compile``); indices clamped into the block, so a batch beyond the bounds never indexes out of it."""
    n, t_len = is_init.shape
    clamped = segment_index(is_init).clamp(max=num_slices - 1)
    lengths = segment_lengths(clamped, num_slices).clamp(1, slice_len)
    step = torch.arange(n * t_len, device=is_init.device)
    first = step.new_zeros(num_slices).scatter_reduce(0, clamped, step, "amin", include_self=False)
    pos = (step - first[clamped]).clamp(max=slice_len - 1).reshape(n, t_len)
    seg_of = clamped.reshape(n, t_len)
    return SegmentPlan((n, t_len), first, lengths, seg_of[:, -1], None, slice_len, num_slices, index=(seg_of, pos),
                       static=True)


@dataclass(frozen=True)
class Route:
    """``backend`` over the call laid out as ``segments``; ``plan``: the call's segments (``None`` for ``rows``)."""

    backend: str
    segments: str = "rows"
    plan: SegmentPlan | None = field(default=None, repr=False, compare=False)

    def run(self, layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions) -> Result:
        """The canonical call ``(x [N, T, F], carry, is_init, reset)`` of :mod:`.base` run this way."""
        impl = _SEQUENCES[self.backend]
        if opts.recompute == "full" and self.backend in _CHECKPOINTED:
            impl = checkpointed(impl)
        if self.segments == "rows":
            return Result(*impl(layout, params, x, carry, is_init, reset, opts))
        return _LAYOUTS[self.segments](impl, self.plan, layout, params, x, carry, is_init, reset, opts)


def _initial_carries(p: SegmentPlan, carry: Carry, is_init: torch.Tensor, reset: Carry | None,
                     order: torch.Tensor | None = None) -> Carry:
    """Every segment's carry before its first step, ``[S, L, ·]`` each (in ``order``), reset where ``is_init``."""
    first = p.first if order is None else p.first[order]
    row, start = first // p.shape[1], first % p.shape[1]
    fill = None if reset is None else tuple(map(itemgetter((row, start)), reset))
    return apply_reset(tuple(map(itemgetter(row), carry)), is_init[row, start], fill)


def _dest(p: SegmentPlan, base: torch.Tensor) -> torch.Tensor:
    """``[N * T]``: each step's row in a block whose segment ``s`` holds its steps at rows ``base[s] + pos``."""
    if p.static:
        seg_of, pos = p.positions()
        return (base[seg_of] + pos).reshape(-1)
    n, t_len = p.shape
    steps = torch.arange(n * t_len, device=base.device)
    return steps + torch.repeat_interleave(base - p.first, p.lengths, output_size=n * t_len)


def _scatter(p: SegmentPlan, y_rows: torch.Tensor, dest: torch.Tensor, seg_final: Carry, opts: SequenceOptions,
             order: tuple[torch.Tensor, torch.Tensor] | None = None) -> Result:
    """Block results back to the call's rows: ``y_rows [rows, P]`` (step ``i`` at row ``dest[i]``), each segment's
    final carry ``seg_final [S, L, ·]`` (in segment order, or ``order = (order, rank)``), the segment-end states (a
    static plan's: every step's segment final carry, as its clamped ends can lie past the real segments)."""
    n, t_len = p.shape
    y = y_rows.index_select(0, dest).view(n, t_len, -1)
    last = p.last if order is None else order[1][p.last]
    final = tuple(map(itemgetter(last), seg_final))
    if not opts.segment_states:
        return Result(y, final, None)
    if p.static:
        return Result(y, final, tuple(map(itemgetter(p.positions()[0]), seg_final)))
    ends = p.first + p.lengths - 1
    ends = ends if order is None else ends[order[0]]
    per_step = tuple([s.new_zeros(n * t_len, *s.shape[1:]).index_copy(0, ends, s).view(n, t_len, *s.shape[1:])
                     for s in seg_final])
    return Result(y, final, per_step, segment_ends=True)


def aligned(impl: Callable, p: SegmentPlan, layout: Layout, params, x, carry: Carry, is_init, reset,
            opts: SequenceOptions) -> Result:
    """``impl`` (a backend's ``sequence``) run on the right-aligned segments of ``p``."""
    offset = p.max_len - p.lengths  # [S] front padding of each segment
    dest = _dest(p, torch.arange(p.count, device=x.device) * p.max_len + offset)
    h0 = _initial_carries(p, carry, is_init, reset)
    first = torch.arange(p.max_len, device=x.device) == offset.unsqueeze(1)  # [S, Lmax]: each segment's first step
    to_h0 = tuple([s.unsqueeze(1).expand(s.shape[0], p.max_len, *s.shape[1:]) for s in h0])
    x_block = x.new_zeros(p.count * p.max_len, x.shape[-1]).index_copy(0, dest, x.reshape(-1, x.shape[-1]))
    x_block = x_block.view(p.count, p.max_len, -1)
    y_block, seg_final, _ = impl(layout, params, x_block, h0, first, to_h0, opts.without_segment_states())
    return _scatter(p, y_block.reshape(-1, y_block.shape[-1]), dest, seg_final, opts)


def packed(impl: Callable, p: SegmentPlan, layout: Layout, params, x, carry: Carry, is_init, reset,
           opts: SequenceOptions) -> Result:
    """ATen's kernel (``pad``) on the segments of ``p`` as one packed sequence (time-major over the segments by
    decreasing length): one ``index_copy`` in, one ``index_select`` out, no padding."""
    order, rank = _to(p.order, x.device), _to(p.rank, x.device)
    batch_sizes = alive_per_step(p)
    step_rows = _to(np.cumsum(batch_sizes) - batch_sizes, x.device)  # the first packed row of each step
    seg_of, pos = p.positions()
    dest = step_rows[pos.reshape(-1)] + rank[seg_of.reshape(-1)]  # a permutation of the steps
    data = x.new_empty(dest.shape[0], x.shape[-1]).index_copy(0, dest, x.reshape(-1, x.shape[-1]))
    h0 = _initial_carries(p, carry, is_init, reset, order)
    out, seg_final = pad.kernel(layout, params, data, h0, opts, _to(batch_sizes, torch.device("cpu")))
    return _scatter(p, out, dest, seg_final, opts, order=(order, rank))


def alive_per_step(p: SegmentPlan) -> np.ndarray:
    """``[Lmax]``: how many segments are longer than ``t``, for each ``t`` (a packed sequence's batch sizes)."""
    return p.count - np.cumsum(np.bincount(p.lengths_host, minlength=p.max_len + 1)[:-1])


def buckets(lengths_sorted: np.ndarray) -> list[tuple[int, int, int, int]]:
    """:func:`bucketed`'s ``(first, end, steps, full)`` ranges of these lengths (sorted, decreasing), cut where the
    length halves (at most 2x padded steps); ``full``: the rows that end at the bucket's last step."""
    lengths, cut, first = lengths_sorted.tolist(), [], 0
    while first < len(lengths):
        end = first + 1
        while end < len(lengths) and 2 * lengths[end] > lengths[first]:
            end += 1
        cut.append((first, end, lengths[first], lengths[first:end].count(lengths[first])))
        first = end
    return cut


def bucketed(impl: Callable, p: SegmentPlan, layout: Layout, params, x, carry: Carry, is_init, reset,
             opts: SequenceOptions) -> Result:
    """ATen's kernel (``pad``, one layer) on the segments of ``p`` in length buckets (:func:`buckets`), one unpacked
    call each (keeping oneDNN's fused LSTM and a backward linear in the steps) on its left-aligned block, the blocks
    in one buffer. A segment's final ``h`` is its output at its last step; where it ends before its bucket, its other
    carry parts (the LSTM's ``c``) are recomputed from the outputs (``Cell.carry_rest_given_h``)."""
    lengths_sorted = p.lengths_host[p.order]
    cut = buckets(lengths_sorted)
    bounds = np.array(cut)
    rows, steps = bounds[:, 1] - bounds[:, 0], bounds[:, 2]
    steps_sorted = np.repeat(steps, rows)
    base = (np.cumsum(steps_sorted) - steps_sorted)[p.rank]  # each segment's first row in the buffer
    order, rank = _to(p.order, x.device), _to(p.rank, x.device)
    lengths_d = _to(lengths_sorted, x.device)
    dest = _dest(p, _to(base, x.device))
    h0 = _initial_carries(p, carry, is_init, reset, order)
    # one split, not a slice per bucket: each slice's backward would zero-fill a gradient of the whole buffer
    x_rows = x.new_zeros(int(steps_sorted.sum()), x.shape[-1]).index_copy(0, dest, x.reshape(-1, x.shape[-1]))
    x_b = x_rows.split((rows * steps).tolist())
    h0_b = zip(*map(methodcaller("split", rows.tolist()), h0))
    ys, finals = [], []
    for (first, end, length, full), x_flat, hb in zip(cut, x_b, h0_b):
        xb = x_flat.view(end - first, length, -1)
        yb, final_b = pad.kernel(layout, params, xb, hb, opts)
        lb = lengths_d[first:end]
        h_last = yb.gather(1, (lb - 1).view(-1, 1, 1).expand(-1, 1, yb.shape[-1]))  # [Sb, 1, P]
        others = final_b[1:]  # right for the prefix of the bucket that ends at its last step
        if full < end - first and others:  # rows ending early: their parts after h, recomputed
            rest = slice(full, end - first)
            short = _other_finals(layout, params, xb[rest, : int(lengths_sorted[first + full])],
                                  tuple(map(itemgetter(rest), hb)), yb[rest], lb[rest])
            others = [torch.cat([a[:full], b]) for a, b in zip(others, short)]
        finals.append((h_last, *others))
        ys.append(yb.reshape(-1, yb.shape[-1]))
    seg_final = finals[0] if len(finals) == 1 else tuple(map(torch.cat, zip(*finals)))  # in sorted order
    return _scatter(p, ys[0] if len(ys) == 1 else torch.cat(ys), dest, seg_final, opts, order=(order, rank))


def _other_finals(layout: Layout, params, x_block, h0: Carry, y_block, lengths: torch.Tensor) -> Carry:
    """The carry parts after ``h`` after each row's last step (one layer), from the rows' inputs ``x_block [R, T, F]``,
    outputs ``y_block [R, T, P]``, initial carries ``h0`` (``[R, 1, ·]``) and step counts ``lengths [R]``."""
    w = layout.cell.layer_weights(params, layout, 0)
    gi = F.linear(x_block, w.weight_ih, w.bias_ih)
    h_prev = torch.cat([h0[0], y_block[:, : x_block.shape[1] - 1]], dim=1)  # h before each step
    rest = layout.cell.carry_rest_given_h(gi, h_prev, tuple([s[:, 0] for s in h0[1:]]), w)
    last = (lengths - 1).view(-1, 1, 1)
    return tuple([parts.gather(1, last.expand(-1, 1, parts.shape[-1])) for parts in rest])


def slice_carries(slice_len: int, k: int, carry: Carry, reset: Carry | None) -> Carry:
    """The carry before each of the ``k`` slices of every row, ``[N * k, ...]``: the call's, then reset states."""
    n = carry[0].shape[0]
    later = (tuple([s.new_zeros(n, k - 1, *s.shape[1:]) for s in carry]) if reset is None
             else tuple([r[:, slice_len:k * slice_len:slice_len] for r in reset]))
    return tuple([torch.cat([s.unsqueeze(1), r], dim=1).reshape(n * k, *s.shape[1:]) for s, r in zip(carry, later)])


def merge_slices(n: int, t_len: int, y: torch.Tensor, final: Carry, per_step: Carry | None) -> Result:
    """Results of ``[N * K, T / K]`` slices back to their ``N`` rows."""
    k = final[0].shape[0] // n
    y = y.reshape(n, t_len, y.shape[-1])
    final = tuple([s.reshape(n, k, *s.shape[1:])[:, -1] for s in final])
    if per_step is not None:
        per_step = tuple([s.reshape(n, t_len, *s.shape[2:]) for s in per_step])
    return Result(y, final, per_step)


def whole_slices(impl: Callable, p: SegmentPlan, layout: Layout, params, x, carry: Carry, is_init, reset,
                 opts: SequenceOptions) -> Result:
    """``pad`` on rows of slices of ``L = p.slice_len`` steps from ``t = 0``: the whole slices as one kernel call on
    the view ``[N * T // L, L]``; the shorter last ones (``T mod L`` steps) as a second call or, where the carry is
    ``h`` alone over one layer, zero-padded in the same call (its final ``h`` is its output at ``T - 1``). Every other
    slice ends at its call's last step: the kernel's final carries are the slices'."""
    slice_len = p.slice_len
    n, t_len = p.shape
    tail = t_len % slice_len
    padded_tail = bool(tail) and layout.num_layers == 1 and len(layout.state_sizes) == 1
    k = -(-t_len // slice_len) if padded_tail else t_len // slice_len
    whole = k * slice_len
    inner = opts.without_segment_states()
    carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple([r[:, 0] for r in reset]))
    x_s = F.pad(x, (0, 0, 0, whole - t_len)) if padded_tail else x[:, :whole]
    x_s = x_s.reshape(n * k, slice_len, x.shape[-1])
    y_s, slice_finals = pad.kernel(layout, params, x_s, slice_carries(slice_len, k, carry, reset), inner)
    y, final, _, _ = merge_slices(n, whole, y_s, slice_finals, None)
    tail_finals, ended = None, k  # ended: the slices whose final carry the kernel holds
    if padded_tail:
        y, ended = y[:, :t_len], k - 1
        final = tail_finals = (y[:, -1].unsqueeze(1).clone(),)  # not a view of the outputs
    elif tail:  # the shorter last slices
        tail_carry = tuple(map(torch.zeros_like, carry)) if reset is None else tuple([r[:, whole] for r in reset])
        y_tail, tail_finals = pad.kernel(layout, params, x[:, whole:], tail_carry, inner)
        y, final = torch.cat([y, y_tail], dim=1), tail_finals
    if not opts.segment_states:
        return Result(y, final, None)
    per_step = []  # the segment-end states: each slice's final carry at its last step
    for i, part in enumerate(slice_finals):
        states = part.new_zeros(n, t_len, *part.shape[1:])
        ends = part.view(n, k, *part.shape[1:])[:, :ended]
        states[:, slice_len - 1:ended * slice_len:slice_len] = ends
        if tail_finals is not None:
            states[:, -1] = tail_finals[i]
        per_step.append(states)
    return Result(y, final, tuple(per_step), segment_ends=True)


_LAYOUTS = {"aligned": aligned, "packed": packed, "buckets": bucketed, "slices": whole_slices}  # Route.run's, by name
