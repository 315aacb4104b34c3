"""A route: the backend that runs a call and how it lays out the call's segments.

The functional layer picks one :class:`Route` per call and runs it; every layout returns a
:class:`~.segments.Result`. ``segments`` is one of :data:`SEGMENT_LAYOUTS`: ``rows`` (the call as it
is, resets applied on the device), ``aligned`` (the segments right-aligned, any backend), ``packed``,
``buckets`` and ``slices`` (``pad``'s ATen kernels on the segments, :mod:`.segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cells import Carry, Layout
from . import pad, parallel, reference, scan, segments
from . import triton as triton_backend
from .base import SequenceOptions
from .recompute import checkpointed
from .segments import Result, SegmentPlan

SEGMENT_LAYOUTS = ("rows", "aligned", "packed", "buckets", "slices")
LAYOUTS_OF = {"reference": ("rows", "aligned"), "scan": ("rows", "aligned"), "pad": ("packed", "buckets", "slices"),
              "triton": ("rows",), "parallel": ("rows",)}  # the layouts each backend runs a call with interior resets in


_SEQUENCES = {"reference": reference.sequence, "parallel": parallel.sequence, "scan": scan.sequence, "pad": pad.sequence,
              "triton": triton_backend.sequence}
_CHECKPOINTED = ("reference", "parallel")  # recompute="full" by activation checkpointing; scan and triton serve it


@dataclass(frozen=True)
class Route:
    """``backend`` over the call laid out as ``segments``; ``plan``: the call's segments (``None`` for ``rows``)."""

    backend: str
    segments: str = "rows"
    plan: SegmentPlan | None = field(default=None, repr=False, compare=False)

    def run(self, layout: Layout, params, x, carry: Carry, is_init, reset, opts: SequenceOptions) -> Result:
        """The call ``(x [N, T, F], carry, is_init, reset)`` of :mod:`.base` run this way."""
        impl = _SEQUENCES[self.backend]
        if opts.recompute == "full" and self.backend in _CHECKPOINTED:
            impl = checkpointed(impl)
        if self.segments == "rows":
            return Result(*impl(layout, params, x, carry, is_init, reset, opts))
        if self.segments == "aligned":
            return segments.aligned(impl, self.plan, layout, params, x, carry, is_init, reset, opts)
        if self.segments == "packed":
            return segments.packed(self.plan, layout, params, x, carry, is_init, reset, opts)
        if self.segments == "buckets":
            return segments.bucketed(self.plan, layout, params, x, carry, is_init, reset, opts)
        return segments.whole_slices(self.plan, layout, params, x, carry, is_init, reset, opts)
