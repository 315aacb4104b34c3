"""Trajectory slices with static shapes under ``torch.compile``: ``slice_len`` (and ``num_slices``).

A flat ``SliceSampler`` batch ``[N]`` holds trajectory slices, ``is_init`` True at each slice start.
Segment-aware execution (:mod:`.segments`) runs them side by side, but its segment count and
longest segment are data-dependent host values; under ``torch.compile`` the call would run as one
row of ``N`` steps. A static hint from the sampler's own settings gives every shape in advance:

* ``slice_len=L`` (``SliceSampler(slice_len=L, strict_length=True)``: whole slices of exactly
  ``L`` steps): a call ``[N, T]`` (``T`` a multiple of ``L``; a flat batch is ``N = 1``) runs as
  ``[N * T / L, L]``, a reshape (:func:`split`, :func:`merge`), eagerly and compiled. The row of
  slice ``(n, k)`` starts from the call's carry for ``k = 0`` (reset there if ``is_init[n, 0]``) and
  is reset at its first step for ``k > 0``: exactly the call's semantics when ``is_init`` is True at
  every multiple of ``L``, which is checked.
* ``slice_len=L, num_slices=K`` (``strict_length=False``: at most ``K`` slices of at most ``L``
  steps, ``N`` varying between batches): under ``torch.compile`` the segments run right-aligned in
  a zero-padded ``[K, L]`` block (:func:`padded`, the scheme of :func:`.segments.aligned` with a
  plan built from static shapes only); eagerly the call takes the usual segment-aware path.

Resets inside a slice stay ordinary resets. The checks raise a ``ValueError`` eagerly; under
``torch.compile`` they are ``torch._assert_async`` ops in the graph (a ``RuntimeError`` from the
compiled call, no host synchronisation on CUDA).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..backends import SequenceOptions, pad
from ..cells import Carry, Layout, apply_reset
from . import segments

__all__ = ["check_value", "check_hint", "split", "merge", "padded", "whole_slices"]

_RAGGED = "Pass slice_len=None (and num_slices=None) for batches of other shapes."


def check_value(value, arg: str = "slice_len") -> None:
    """Raise unless ``value`` is None or a positive int (``arg`` names it in the message)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        what = "the most slices in a batch" if arg.endswith("num_slices") else "the length of every slice"
        raise ValueError(f"{arg}: expected None or a positive int ({what}, as given to SliceSampler), got {value!r}.")


def _check(ok: torch.Tensor, compiling: bool, message: Callable[[], str]) -> None:
    """Raise ``message()`` unless ``ok``: a ``ValueError`` eagerly, an in-graph async assert compiled."""
    if compiling:
        torch._assert_async(ok, message())
    elif not bool(ok):
        raise ValueError(message())


def check_hint(slice_len, num_slices, t_len: int, is_init: torch.Tensor | None, compiling: bool) -> None:
    """Raise when the hint does not describe a call of ``T = t_len`` steps with resets ``is_init [N, T]``."""
    check_value(slice_len)
    check_value(num_slices, "num_slices")
    if slice_len is None:
        raise ValueError(f"num_slices={num_slices} needs slice_len (the longest slice); got slice_len=None.")
    if is_init is None:
        raise ValueError(f"slice_len={slice_len}: is_init is required (True at the first step of every slice); got None.")
    if num_slices is not None:
        if is_init.numel() == 0:  # an empty call: no segment
            return
        seg_of = _segment_index(is_init)
        count, lengths = seg_of[-1] + 1, _lengths(seg_of, num_slices)
        _check((count <= num_slices) & (lengths <= slice_len).all(), compiling, lambda: (
            f"slice_len={slice_len}, num_slices={num_slices}: expected at most {num_slices} segments (runs between "
            f"resets) of at most {slice_len} steps, got {int(count)} segments, the longest "
            f"{int(_lengths(seg_of, int(count)).max())} steps" if not compiling else
            "slice_len, num_slices: expected at most num_slices segments (runs between resets) of at most slice_len "
            "steps, the batch has more or longer ones") + f". Pass SliceSampler's slice_len and num_slices (its "
            f"batch_size // slice_len). {_RAGGED}")
        return
    if t_len % slice_len:
        raise ValueError(
            f"slice_len={slice_len}: the time dim (T={t_len}, the flat batch's length) must be a multiple of it "
            f"(whole slices of exactly {slice_len} steps, as SliceSampler(slice_len={slice_len}, strict_length=True) "
            f"returns). For truncated slices (strict_length=False) pass num_slices too. {_RAGGED}"
        )
    starts = is_init[:, slice_len::slice_len]

    def message() -> str:
        if compiling:  # the numbers may be symbolic (dynamic=True): a graph cannot format them
            return ("slice_len: is_init must be True at every slice start (every multiple of slice_len along T): the "
                    f"batch is not whole slices of slice_len steps. {_RAGGED}")
        row, k = (~starts).nonzero()[0].tolist()
        return (f"slice_len={slice_len}: is_init must be True at every slice start (every multiple of {slice_len} "
                f"along T={t_len}), but is_init[{row}, {(k + 1) * slice_len}] is False ({int((~starts).sum())} of "
                f"{starts.numel()} slice starts are False): the batch is not whole slices of {slice_len} steps. "
                f"{_RAGGED}")

    if starts.numel():
        _check(starts.all(), compiling, message)


def _segment_index(is_init: torch.Tensor) -> torch.Tensor:
    """``[N * T]`` int64: each step's segment of ``is_init [N, T]`` (row-major; a row's first step starts one)."""
    starts = is_init.clone()
    starts[:, 0] = True
    return starts.reshape(-1).cumsum(0) - 1


def _lengths(seg_of: torch.Tensor, bound: int) -> torch.Tensor:
    """``[bound]``: the step counts of the first ``bound`` segments, zeros past the last (static shapes)."""
    seg_of = seg_of.clamp(max=bound - 1)
    return seg_of.new_zeros(bound).scatter_add(0, seg_of, torch.ones_like(seg_of))


def split(slice_len: int, x: torch.Tensor, carry: Carry, is_init: torch.Tensor, reset: Carry | None):
    """A call ``x [N, T, F]`` as ``[N * K, slice_len, F]`` (``K = T / slice_len``): ``(x, carry, is_init, reset)``.

    Row ``n * K + k`` is slice ``k`` of row ``n``; its carry is :func:`_slice_carries`' (what the backend
    puts there, as ``is_init`` is True at its first step).
    """
    n, t_len = is_init.shape
    k = t_len // slice_len
    rows = n * k
    carry = _slice_carries(slice_len, k, carry, reset)
    x = x.reshape(rows, slice_len, x.shape[-1])
    is_init = is_init.reshape(rows, slice_len)
    reset = None if reset is None else tuple(r.reshape(rows, slice_len, *r.shape[2:]) for r in reset)
    return x, carry, is_init, reset


def _slice_carries(slice_len: int, k: int, carry: Carry, reset: Carry | None) -> Carry:
    """The carry before each of the ``k`` slices of every row, ``[N * k, ...]``: the call's for the first slice
    and, for the others, the slice's reset state at its first step (zeros without ``reset``)."""
    n = carry[0].shape[0]
    later = (tuple(s.new_zeros(n, k - 1, *s.shape[1:]) for s in carry) if reset is None
             else tuple(r[:, slice_len:k * slice_len:slice_len] for r in reset))
    return tuple(torch.cat([s.unsqueeze(1), r], dim=1).reshape(n * k, *s.shape[1:]) for s, r in zip(carry, later))


def merge(n: int, t_len: int, y: torch.Tensor, final: Carry, per_step: Carry | None):
    """Inverse of :func:`split` on the results: ``(y [N, T, P], carry_T [N, ...], per-step [N, T, ...])``."""
    k = final[0].shape[0] // n
    y = y.reshape(n, t_len, y.shape[-1])
    final = tuple(s.reshape(n, k, *s.shape[1:])[:, -1] for s in final)
    if per_step is not None:
        per_step = tuple(s.reshape(n, t_len, *s.shape[2:]) for s in per_step)
    return y, final, per_step


def padded(impl: Callable, is_init: torch.Tensor, slice_len: int, num_slices: int) -> Callable:
    """``impl`` (a backend's canonical ``sequence``) over the segments of ``is_init [N, T]`` right-aligned
    in a ``[num_slices, slice_len]`` block: :func:`.segments.aligned` with a plan of static shapes.

    Rows of the block past the last segment hold no step: they compute values that no step reads.
    Indices are clamped into the block, so a batch beyond the bounds (which :func:`check_hint`
    rejects) never indexes out of it.
    """
    n, t_len = is_init.shape
    seg_of = _segment_index(is_init)
    lengths = _lengths(seg_of, num_slices).clamp(1, slice_len)
    seg_of = seg_of.clamp(max=num_slices - 1)
    step = torch.arange(n * t_len, device=is_init.device)
    first = step.new_zeros(num_slices).scatter_reduce(0, seg_of, step, "amin", include_self=False)
    pos = (step - first[seg_of]).clamp(max=slice_len - 1).reshape(n, t_len)
    plan = segments.SegmentPlan((n, t_len), first, first // t_len, first % t_len, lengths, lengths, slice_len,
                                index=(seg_of.reshape(n, t_len), pos), static=True)
    return segments.aligned(impl, plan)


def whole_slices(slice_len: int) -> Callable:
    """The ``pad`` backend on a call whose rows are slices of ``slice_len`` steps from ``t = 0``, the last one
    ``T mod slice_len`` steps where ``slice_len`` does not divide ``T`` (:attr:`.segments.SegmentPlan.slice_len`):
    the whole slices run as one kernel call on the view ``[N * T // slice_len, slice_len]``, the shorter last
    ones as a second call ``[N, T mod slice_len]``, or, where the carry is ``h`` alone over one layer (the
    GRU: ``h`` is the output), zero-padded to ``slice_len`` steps in the same call (padding after a slice's
    end cannot change its steps; its final ``h`` is its output at ``T - 1``). No gather: every other slice
    ends at its call's last step, so the kernel's final carries are the slices' final carries. The per-step
    carries are the segment-end states (:func:`.segments.mark_segment_ends`). Eager only."""

    def sequence(layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions):
        n, t_len = is_init.shape
        tail = t_len % slice_len
        padded_tail = bool(tail) and layout.num_layers == 1 and len(carry) == 1
        k = -(-t_len // slice_len) if padded_tail else t_len // slice_len
        whole = k * slice_len
        inner = dataclasses.replace(opts, segment_states=False)
        carry = apply_reset(carry, is_init[:, 0], None if reset is None else tuple(r[:, 0] for r in reset))
        x_s = F.pad(x, (0, 0, 0, whole - t_len)) if padded_tail else x[:, :whole]
        x_s = x_s.reshape(n * k, slice_len, x.shape[-1])
        y_s, slice_finals, _ = pad.sequence(layout, params, x_s, _slice_carries(slice_len, k, carry, reset), None,
                                            None, inner)
        y, final, _ = merge(n, whole, y_s, slice_finals, None)
        tail_finals, ended = None, whole // slice_len  # ended: the slices whose final carry the kernel holds
        if padded_tail:
            y, ended = y[:, :t_len], k - 1
            final = tail_finals = (y[:, -1].unsqueeze(1).clone(),)  # not a view of the outputs
        elif tail:  # the shorter last slices
            tail_carry = (tuple(s.new_zeros(s.shape) for s in carry) if reset is None
                          else tuple(r[:, whole] for r in reset))
            y_tail, tail_finals, _ = pad.sequence(layout, params, x[:, whole:], tail_carry, None, None, inner)
            y, final = torch.cat([y, y_tail], dim=1), tail_finals
        if not opts.segment_states:
            return y, final, None
        per_step = []  # the segment-end states: each slice's final carry at its last step
        for i, part in enumerate(slice_finals):
            states = part.new_zeros(n, t_len, *part.shape[1:])
            ends = part.view(n, k, *part.shape[1:])[:, :ended]
            states[:, slice_len - 1:ended * slice_len:slice_len] = ends
            if tail_finals is not None:
                states[:, -1] = tail_finals[i]
            per_step.append(states)
        return y, final, tuple(per_step)

    sequence.__qualname__ = f"whole_slices({slice_len})"
    return segments.mark_segment_ends(sequence)
