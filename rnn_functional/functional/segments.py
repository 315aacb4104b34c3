"""Segment-aware execution: a call re-batched by its segments, for any backend.

A *segment* is a maximal run of steps of one row between resets: it starts at ``t = 0`` or
where ``is_init`` is True and ends before the next reset or at ``T - 1``. No state crosses a
reset, so the segments of every row are independent sequences: each starts from its own
initial carry (the incoming carry, reset where ``is_init[:, 0]``, for a segment at ``t = 0``;
``reset_state`` at its first step, or zeros, for the others). Re-batched, a call of ``N`` rows
of ``T`` steps becomes ``S`` rows (one per segment) of at most ``Lmax`` steps (the longest
segment) with no interior reset: a flat ``SliceSampler`` batch ``[1, N]`` runs its slices side
by side instead of ``N`` steps of one row.

Three schemes, all exact (and, where every row is whole slices of one length,
:func:`.slices.whole_slices`: a view of the call, no re-batching):

* :func:`aligned`, for any backend's canonical ``sequence``: the segments are right-aligned in an
  ``[S, Lmax]`` block (front padding) and each segment's first real step is marked as a reset to
  its initial carry. Every segment then ends at the block's last step: its final carry is the
  backend's final carry. The padded steps compute values that the reset discards.
* :func:`packed`, for the ``pad`` backend: the steps, permuted into the packed (time-major) layout of
  the segments sorted by length, run by ATen's kernels as one packed sequence
  (:func:`rnn_functional.backends.pad.packed_sequence`).
* :func:`bucketed`, for the ``pad`` backend with one layer: the segments, sorted by length, are cut
  into a few buckets (by a cost model: padding against more calls); each bucket runs as one plain
  (unpacked) ATen call on its left-aligned ``[S_b, L_b]`` block. Unpacked calls keep the fast
  kernels (oneDNN's LSTM on CPU) and their backward is linear in the steps, where a packed call's
  backward on CPU zero-fills the whole input-projection gradient at every step
  (``docs/backends.md``). Outputs at real steps are exact (padding follows them); a segment's final
  carry is its output at its last step for the carry's output part (``h``) and, for the other parts
  (the LSTM's ``c``) of a segment shorter than its bucket, recomputed by the cell's step from the
  kernel's outputs (:func:`_other_finals`).

Segment counts and lengths are data-dependent host values: both are eager-only (the selection
layer never re-batches under ``torch.compile`` or ``torch.func`` transforms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..backends import SequenceOptions, pad
from ..cells import Carry, Layout, apply_reset

# Cost model of the length buckets (:func:`_buckets`), in row-steps: a step of a kernel call costs as
# much as ~16 more rows, a step of the recompute loop too, and a row-step of it (its gates' GEMMs, forward and
# backward) as ~2 row-steps of the kernel (CPU, H=128, fwd+bwd; docs/backends.md).
_CALL_STEP_ROWS = 16
_RECOMPUTE_STEP_ROWS = 16
_RECOMPUTE_ROW_STEPS = 2.0
# Forward only, a recompute row-step (no backward) and a call cost less: the cut of docs/backends.md's forward rows.
_RECOMPUTE_ROW_STEPS_NO_GRAD = 0.5
_MAX_DISTINCT = 256


@dataclass
class SegmentPlan:
    """Where the segments of an ``[N, T]`` call lie (``S`` segments, the longest ``max_len`` steps).

    ``shape``: ``(N, T)``; ``first [S]``: each segment's first step, row-major over ``N * T``; ``row [S]``
    and ``start [S]``: its row and step; ``lengths [S]`` (on the device) and ``lengths_cpu [S]``: the
    segments' step counts. :attr:`seg_of` and :attr:`pos` (``[N, T]``: each step's segment and its index
    within it) are derived on first use, by the paths that gather; ``index`` holds them once known.
    ``static``: a plan of static shapes (:func:`.slices.padded`, under ``torch.compile``) whose ``first``
    and ``lengths`` are bounds-clamped estimates past the real segments: its paths index by ``index`` only.
    ``memo``: what the rule and the path it picks share (:attr:`slice_len`, the sorted lengths, the
    buckets of :func:`bucketed` per ``recompute`` and ``records_grad`` flag), computed once.
    """

    shape: tuple[int, int]
    first: torch.Tensor
    row: torch.Tensor
    start: torch.Tensor
    lengths: torch.Tensor
    lengths_cpu: torch.Tensor
    max_len: int
    index: tuple[torch.Tensor, torch.Tensor] | None = None
    static: bool = False
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def count(self) -> int:
        """``S``, the number of segments."""
        return int(self.first.shape[0])

    def _index(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.index is None:
            n, t_len = self.shape
            dev = self.first.device
            seg_of = torch.repeat_interleave(torch.arange(self.count, device=dev), self.lengths, output_size=n * t_len)
            pos = torch.arange(n * t_len, device=dev) - self.first[seg_of]
            self.index = (seg_of.view(n, t_len), pos.view(n, t_len))
        return self.index

    @property
    def seg_of(self) -> torch.Tensor:
        return self._index()[0]

    @property
    def pos(self) -> torch.Tensor:
        return self._index()[1]

    @property
    def last(self) -> torch.Tensor:
        """``[N]``: the segment that ends each row."""
        n, t_len = self.shape
        if self.static:
            return self.seg_of[:, -1]
        row_ends = torch.arange(1, n + 1, device=self.first.device) * t_len
        return torch.searchsorted(self.first, row_ends) - 1

    @property
    def slice_len(self) -> int | None:
        """``L`` when every row is slices of ``L < T`` steps from ``t = 0``, its last one ``T mod L`` steps where
        ``L`` does not divide ``T`` (whole ``SliceSampler`` slices); else None. From host values only."""
        if "slice_len" not in self.memo:
            n, t_len = self.shape
            length = int(self.lengths_cpu[0])
            whole, tail = divmod(t_len, length)
            per_row = whole + (tail > 0)
            regular = length < t_len and self.count == n * per_row
            if regular:
                pattern = torch.full((per_row,), length, dtype=self.lengths_cpu.dtype)
                pattern[-1] = tail or length
                regular = bool((self.lengths_cpu.view(n, per_row) == pattern).all())
            self.memo["slice_len"] = length if regular else None
        return self.memo["slice_len"]


def plan(is_init: torch.Tensor) -> SegmentPlan:
    """The segments of a call with resets ``is_init [N, T]`` (bool, ``N, T > 0``); syncs with the host once."""
    n, t_len = is_init.shape
    starts = is_init.clone()
    starts[:, 0] = True
    first = starts.reshape(-1).nonzero().squeeze(1)
    lengths = torch.diff(first, append=first.new_full((1,), n * t_len))
    lengths_cpu = lengths.cpu()
    return SegmentPlan((n, t_len), first, first // t_len, first % t_len, lengths, lengths_cpu, int(lengths_cpu.max()))


def _initial_carries(p: SegmentPlan, carry: Carry, is_init: torch.Tensor, reset: Carry | None,
                     order: torch.Tensor | None = None) -> Carry:
    """Every segment's carry before its first step (in ``order`` where given): tuple of ``[S, L, ·]``.

    A segment starts from its row's incoming carry unless ``is_init`` is True at its first step (always,
    past ``t = 0``), where it starts from ``reset`` there, or zeros.
    """
    row, start = (p.row, p.start) if order is None else (p.row[order], p.start[order])
    fill = None if reset is None else tuple(r[row, start] for r in reset)
    return apply_reset(tuple(s[row] for s in carry), is_init[row, start], fill)


def _dest(p: SegmentPlan, base: torch.Tensor) -> torch.Tensor:
    """``[N * T]``: each step's row in a block whose segment ``s`` holds its steps at rows ``base[s] + pos``."""
    if p.static:
        seg_of, pos = p.index
        return (base[seg_of] + pos).reshape(-1)
    n, t_len = p.shape
    steps = torch.arange(n * t_len, device=base.device)
    return steps + torch.repeat_interleave(base - p.first, p.lengths, output_size=n * t_len)


def _block(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    """``x [N, T, F]`` as a block of ``rows`` rows ``[rows, F]``: step ``i`` at row ``dest[i]``, zeros elsewhere."""
    return x.new_zeros(rows, x.shape[-1]).index_copy(0, dest, x.reshape(-1, x.shape[-1]))


def _scatter(p: SegmentPlan, y_rows: torch.Tensor, dest: torch.Tensor, seg_final: Carry, opts: SequenceOptions,
             order: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Block results back to the call's rows: ``(y [N, T, P], carry_T, per-step carries)``.

    ``y_rows [rows, P]``: the block's outputs, step ``i`` at row ``dest[i]``; ``seg_final``: each segment's
    final carry ``[S, L, ·]``, in segment order or, with ``order = (order, rank)``, in the order ``order``
    (``rank`` its inverse). The per-step carries are the segment-end states themselves (each segment's
    final carry at its last step, zeros elsewhere: :func:`mark_segment_ends`), except for a plan of
    static shapes, whose per-step carries hold every step's segment final carry.
    """
    n, t_len = p.shape
    y = y_rows.index_select(0, dest).view(n, t_len, -1)
    last = p.last if order is None else order[1][p.last]
    final = tuple(s.index_select(0, last) for s in seg_final)
    if not opts.segment_states:
        return y, final, None
    if p.static:  # clamped ends past the real segments: gather every step's segment
        return y, final, tuple(s[p.seg_of] for s in seg_final)
    ends = p.first + p.lengths - 1
    ends = ends if order is None else ends[order[0]]
    per_step = tuple(s.new_zeros(n * t_len, *s.shape[1:]).index_copy(0, ends, s).view(n, t_len, *s.shape[1:])
                     for s in seg_final)
    return y, final, per_step


def mark_segment_ends(sequence: Callable) -> Callable:
    """``sequence`` marked as returning the segment-end states as its per-step carries (zeros but at each
    segment's last step), which the core then keeps as they are (``segment_ends_only``)."""
    sequence.segment_ends_only = True
    return sequence


def aligned(impl: Callable, p: SegmentPlan) -> Callable:
    """``impl`` (a backend's canonical ``sequence``) run on the right-aligned segments of ``p``."""

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        offset = p.max_len - p.lengths  # [S] front padding of each segment
        dest = _dest(p, torch.arange(p.count, device=x.device) * p.max_len + offset)
        h0 = _initial_carries(p, carry, is_init, reset)
        first = torch.zeros(p.count, p.max_len, dtype=torch.bool, device=x.device)
        first[torch.arange(p.count, device=x.device), offset] = True
        to_h0 = tuple(s.unsqueeze(1).expand(s.shape[0], p.max_len, *s.shape[1:]) for s in h0)
        inner = dataclasses.replace(opts, segment_states=False)
        x_block = _block(x, dest, p.count * p.max_len).view(p.count, p.max_len, -1)
        y_block, seg_final, _ = impl(layout, params, x_block, h0, first, to_h0, inner)
        return _scatter(p, y_block.reshape(-1, y_block.shape[-1]), dest, seg_final, opts)

    sequence.__qualname__ = f"aligned({getattr(impl, '__qualname__', impl)})"
    return sequence if p.static else mark_segment_ends(sequence)


def packed(p: SegmentPlan) -> Callable:
    """The ``pad`` backend run on the segments of ``p`` packed by their lengths, one kernel call.

    The packed steps are the call's steps permuted (time-major over the segments sorted by decreasing
    length): one ``index_copy`` in and one ``index_select`` out, no padding.
    """

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        order, lengths_sorted = _sorted(p)
        dev, steps = x.device, p.shape[0] * p.shape[1]
        batch_sizes = p.count - torch.bincount(torch.tensor(lengths_sorted), minlength=p.max_len + 1)[:-1].cumsum(0)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(p.count)
        order_d, rank_d = order.to(dev), rank.to(dev)
        seg_of, pos = p.seg_of.reshape(-1), p.pos.reshape(-1)
        step_rows = (batch_sizes.cumsum(0) - batch_sizes).to(dev)  # the first packed row of each step
        dest = step_rows[pos] + rank_d[seg_of]  # a permutation of the steps
        data = x.new_empty(steps, x.shape[-1]).index_copy(0, dest, x.reshape(-1, x.shape[-1]))
        h0 = _initial_carries(p, carry, is_init, reset, order_d)
        out, seg_final = pad.packed_sequence(layout, params, data, batch_sizes, h0, opts)
        return _scatter(p, out, dest, seg_final, opts, order=(order_d, rank_d))

    return mark_segment_ends(sequence)


def _call_cost(steps: int, rows: int, short_steps: int, short_rows: int, recompute: bool,
               records_grad: bool = True) -> float:
    """Estimated cost, in row-steps, of one bucket call of ``steps`` steps over ``rows`` rows, ``short_rows``
    of which end before its last step (the longest of them after ``short_steps``); see :func:`_buckets`."""
    cost = steps * (rows + _CALL_STEP_ROWS)
    if recompute and short_rows:
        row_steps = _RECOMPUTE_ROW_STEPS if records_grad else _RECOMPUTE_ROW_STEPS_NO_GRAD
        cost += short_steps * (_RECOMPUTE_STEP_ROWS + short_rows * row_steps)
    return cost


def _buckets(lengths_sorted: list[int], recompute: bool, records_grad: bool = True) -> list[tuple[int, int, int]]:
    """``(first, end, steps)`` row ranges of segments sorted by decreasing length, one kernel call each.

    The cut minimises an estimated cost, in row-steps: a call of ``steps`` steps over ``rows`` rows
    costs ``steps * (rows + _CALL_STEP_ROWS)``; with ``recompute`` (a carry with parts after ``h``),
    its rows shorter than ``steps`` add the cell's step loop of :func:`_other_finals` over the longest
    of them, ``_RECOMPUTE_STEP_ROWS`` plus ``_RECOMPUTE_ROW_STEPS`` per short row per step
    (``_RECOMPUTE_ROW_STEPS_NO_GRAD`` when autograd does not record the call). Exact dynamic programming over the distinct
    lengths (at most ``_MAX_DISTINCT`` of them; beyond, buckets of lengths within a factor of two).
    """
    distinct = sorted(set(lengths_sorted), reverse=True)
    if len(distinct) > _MAX_DISTINCT:
        out, first = [], 0
        while first < len(lengths_sorted):
            end = first
            while end < len(lengths_sorted) and 2 * lengths_sorted[end] > lengths_sorted[first]:
                end += 1
            out.append((first, end, lengths_sorted[first]))
            first = end
        return out
    ends = [0]  # ends[k]: rows of the k longest distinct lengths
    for d in distinct:
        ends.append(ends[-1] + lengths_sorted.count(d))
    best, cut = [0.0] + [float("inf")] * len(distinct), [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        for i in range(j):
            short = j - 1 > i  # the bucket holds rows shorter than its steps
            cost = best[i] + _call_cost(distinct[i], ends[j] - ends[i], distinct[i + 1] if short else 0,
                                        ends[j] - ends[i + 1] if short else 0, recompute, records_grad)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], len(distinct)
    while j > 0:
        i = cut[j]
        out.append((ends[i], ends[j], distinct[i]))
        j = i
    return out[::-1]


def _other_finals(layout: Layout, params, x_block, h0: Carry, y_block, lengths: torch.Tensor) -> Carry:
    """The carry parts after ``h`` (e.g. the LSTM's ``c``) after each row's last step, one layer.

    ``x_block [R, T, F]`` and ``y_block [R, T, P]`` hold the rows' inputs and the kernel's outputs,
    ``h0`` their initial carries ``[R, 1, ·]``, ``lengths [R]`` (on the device) their step counts.
    The cell follows its other parts from ``h0`` with ``h`` read from the outputs
    (:meth:`~rnn_functional.cells.Cell.carry_rest_given_h`; they depend on nothing else), so the
    result is the carry the kernel held at each row's last step.
    """
    cell = layout.cell
    w = cell.layer_weights(params, layout, 0)
    gi = F.linear(x_block, w.weight_ih, w.bias_ih)
    h_prev = torch.cat([h0[0], y_block[:, : x_block.shape[1] - 1]], dim=1)  # h before each step
    rest = cell.carry_rest_given_h(gi, h_prev, tuple(s[:, 0] for s in h0[1:]), w)
    last = (lengths - 1).view(-1, 1, 1)
    return tuple(parts.gather(1, last.expand(-1, 1, parts.shape[-1])) for parts in rest)


def _sorted(p: SegmentPlan) -> tuple[torch.Tensor, list[int]]:
    """``(order, lengths_sorted)``: the segments of ``p`` sorted by decreasing length (stable), on the CPU (memoised)."""
    if "sorted" not in p.memo:
        order = torch.argsort(p.lengths_cpu, descending=True, stable=True)
        p.memo["sorted"] = (order, p.lengths_cpu[order].tolist())
    return p.memo["sorted"]


def _plan_buckets(p: SegmentPlan, layout: Layout, records_grad: bool = True
                  ) -> tuple[torch.Tensor, list[int], list[tuple[int, int, int, int]]]:
    """``(order, lengths_sorted, buckets)``: :func:`_sorted` and :func:`_buckets` of the segments of ``p`` for
    ``layout``'s carry (and ``records_grad``), each bucket with the count of its rows that end at its last
    step, ``(first, end, steps, full)`` (memoised on ``p``)."""
    recompute = len(layout.state_sizes) > 1
    if ("buckets", recompute, records_grad) not in p.memo:
        order, lengths_sorted = _sorted(p)
        buckets = [(first, end, steps, lengths_sorted[first:end].count(steps))
                   for first, end, steps in _buckets(lengths_sorted, recompute, records_grad)]
        p.memo["buckets", recompute, records_grad] = (order, lengths_sorted, buckets)
    return p.memo["buckets", recompute, records_grad]


def bucket_shapes(p: SegmentPlan, layout: Layout, records_grad: bool = True) -> list[tuple[int, int]]:
    """``(rows, steps)`` of each call that :func:`bucketed` runs on the segments of ``p``."""
    return [(end - first, steps) for first, end, steps, _ in _plan_buckets(p, layout, records_grad)[2]]


def bucket_padding(p: SegmentPlan, layout: Layout, records_grad: bool = True) -> float:
    """Steps that :func:`bucketed` runs for the segments of ``p``, over their real steps (``>= 1``)."""
    buckets = _plan_buckets(p, layout, records_grad)[2]
    return sum((end - first) * steps for first, end, steps, _ in buckets) / (p.shape[0] * p.shape[1])


def bucket_cost(p: SegmentPlan, layout: Layout, records_grad: bool = True) -> float:
    """The estimated cost of :func:`bucketed` on the segments of ``p`` (row-steps, :func:`_call_cost`)."""
    _, lengths_sorted, buckets = _plan_buckets(p, layout, records_grad)
    recompute = len(layout.state_sizes) > 1
    cost = 0.0
    for first, end, steps, full in buckets:
        short_steps = lengths_sorted[first + full] if full < end - first else 0
        cost += _call_cost(steps, end - first, short_steps, end - first - full, recompute, records_grad)
    return cost


def bucketed(p: SegmentPlan, records_grad: bool = True) -> Callable:
    """The ``pad`` backend (one layer) run on the segments of ``p`` in length buckets, one unpacked call each
    (cut for a call that autograd records, or not: ``records_grad``).

    The buckets' blocks ``[S_b, L_b, F]`` lie one after the other in one zero-filled buffer (each
    segment's steps consecutive from its block row's start), filled by one ``index_copy`` and read
    back by one ``index_select`` of the outputs.
    """

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        if layout.num_layers != 1:
            raise ValueError("segments.bucketed serves one layer; use segments.packed for more.")
        order, lengths_sorted, buckets = _plan_buckets(p, layout, records_grad)
        dev = x.device
        rows_per_bucket = torch.tensor([end - first for first, end, _, _ in buckets])
        steps_sorted = torch.tensor([steps for *_, steps, _ in buckets]).repeat_interleave(rows_per_bucket)
        base = torch.empty_like(steps_sorted)
        base[order] = steps_sorted.cumsum(0) - steps_sorted  # each segment's first row in the buffer
        rank = torch.empty_like(order)
        rank[order] = torch.arange(p.count)
        order_d, rank_d, len_d = order.to(dev), rank.to(dev), torch.tensor(lengths_sorted, device=dev)
        dest = _dest(p, base.to(dev))
        x_rows = _block(x, dest, int(steps_sorted.sum()))
        h0 = _initial_carries(p, carry, is_init, reset, order_d)
        run = pad.aten_kernels(layout).sequence
        ys, finals, row = [], [], 0
        for first, end, steps, full in buckets:
            xb = x_rows[row: row + (end - first) * steps].view(end - first, steps, -1)
            row += (end - first) * steps
            hb = tuple(s[first:end] for s in h0)
            yb, hx = run(layout, params, xb, pad.to_layer_major(hb), 0.0, False, None)
            lb = len_d[first:end]
            h_last = yb.gather(1, (lb - 1).view(-1, 1, 1).expand(-1, 1, yb.shape[-1]))  # [Sb, 1, P]
            others = tuple(s.transpose(0, 1)[:full] for s in hx[1:])  # a prefix of the bucket ends at its last step
            if full < end - first:
                rest = slice(full, end - first)
                short = _other_finals(layout, params, xb[rest, : lengths_sorted[first + full]],
                                      tuple(s[rest] for s in hb), yb[rest], lb[rest])
                others = tuple(torch.cat([a, b]) for a, b in zip(others, short))
            finals.append((h_last, *others))
            ys.append(yb.reshape(-1, yb.shape[-1]))
        seg_final = tuple(torch.cat(parts) if len(parts) > 1 else parts[0] for parts in zip(*finals))  # sorted order
        return _scatter(p, torch.cat(ys) if len(ys) > 1 else ys[0], dest, seg_final, opts, order=(order_d, rank_d))

    return mark_segment_ends(sequence)
