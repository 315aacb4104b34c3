"""A route: the backend that runs a call and how it lays out the call's segments, with its estimated cost.

The functional layer picks one :class:`Route` per call and runs it; every layout returns a
:class:`~.segments.Result`. ``segments`` is one of :data:`SEGMENT_LAYOUTS`: ``rows`` (the call as it
is, resets applied on the device), ``aligned`` (the segments right-aligned, any backend), ``packed``,
``buckets`` and ``slices`` (``pad``'s ATen kernels on the segments, :mod:`.segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cells import Carry, Layout
from . import costs, pad, parallel, reference, scan, segments
from . import triton as triton_backend
from .base import SequenceOptions
from .recompute import checkpointed
from .segments import Result, SegmentPlan

SEGMENT_LAYOUTS = ("rows", "aligned", "packed", "buckets", "slices")
LAYOUTS_OF = {"reference": ("rows", "aligned"), "scan": ("rows", "aligned"), "pad": ("packed", "buckets", "slices"),
              "triton": ("rows",), "parallel": ("rows",)}  # the layouts each backend runs a call with interior resets in


def sequence_of(backend: str, opts: SequenceOptions):
    """The canonical ``sequence`` of ``backend`` for ``opts`` (``reference`` and ``parallel`` checkpointed for
    ``recompute="full"``; ``scan`` and ``triton`` serve it themselves)."""
    if backend in ("reference", "parallel"):
        impl = reference.sequence if backend == "reference" else parallel.sequence
        return checkpointed(impl) if opts.recompute == "full" else impl
    return {"scan": scan.sequence, "pad": pad.sequence, "triton": triton_backend.sequence}[backend]


@dataclass(frozen=True)
class Route:
    """``backend`` over the call laid out as ``segments``; ``plan``: the call's segments (``None`` for ``rows``);
    ``records_grad``: autograd records the call (the length buckets are cut for it)."""

    backend: str
    segments: str = "rows"
    plan: SegmentPlan | None = field(default=None, repr=False, compare=False)
    records_grad: bool = field(default=True, repr=False, compare=False)

    def run(self, layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions) -> Result:
        """The call ``(x [N, T, F], carry, is_init, reset)`` of :mod:`.base` run this way."""
        if self.segments == "rows":
            return Result(*sequence_of(self.backend, opts)(layout, params, x, carry, is_init, reset, opts))
        if self.segments == "aligned":
            return segments.aligned(sequence_of(self.backend, opts), self.plan, layout, params, x, carry, is_init,
                                    reset, opts)
        if self.segments == "packed":
            return segments.packed(self.plan, layout, params, x, carry, is_init, reset, opts)
        if self.segments == "buckets":
            return segments.bucketed(self.plan, layout, params, x, carry, is_init, reset, opts, self.records_grad)
        return segments.whole_slices(self.plan, layout, params, x, carry, is_init, reset, opts)

    def cost(self, layout: Layout, shape: tuple[int, int]) -> float:
        """Estimated microseconds of this route on an ``[N, T]`` call (:mod:`.costs`)."""
        n, t_len = shape
        grad, p = self.records_grad, self.plan
        if self.segments == "rows":
            return costs.estimate(layout, grad, self.backend, 1, [(n, t_len)])
        move = costs.moved(layout, grad, n * t_len)
        if self.segments == "aligned":
            return move + costs.estimate(layout, grad, self.backend, 1, [(p.count, p.max_len)])
        if self.segments == "packed":  # step t runs the segments longer than t
            alive = segments.alive_per_step(p)
            ragged = alive[0] != alive[-1]  # ATen's packed backward zero-fills only when the rows per step vary
            return (move + costs.stepped(layout, grad, "packed", alive)
                    + (costs.packed_fill(layout, grad, p.max_len, n * t_len) if ragged else 0.0))
        if self.segments == "buckets":
            cut, lengths = segments.buckets(p, layout, grad), segments.sorted_lengths(p)
            calls = np.array([(steps, end - first, lengths[first + full] if full < end - first else 0, end - first - full)
                              for first, end, steps, full in cut], dtype=float).T
            return move + costs.layout_work(layout, grad, "buckets") + float(costs.bucket_call(layout, grad, *calls).sum())
        k, tail = divmod(t_len, p.slice_len)
        if tail and segments.pads_tail(layout):  # the last slices padded into the one call
            return costs.estimate(layout, grad, "pad", 1, [(n * (k + 1), p.slice_len)])
        return costs.estimate(layout, grad, "pad", 1 + bool(tail), [(n * k, p.slice_len), (n, tail)])
