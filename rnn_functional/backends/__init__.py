"""Backends: run a cell over time (the canonical call of :mod:`.base`, exactly as ``reference``), importing cells,
never the public API. :class:`.segments.Route` runs a call on one, in a layout of its segments; the functional
layer's :func:`rnn_functional.functional._core.choose` picks the route."""

from __future__ import annotations

import torch

from ..cells import Cell
from . import pad, parallel, reference, scan, segments
from . import triton as triton_backend
from .base import BACKENDS, RECOMPUTE_MODES, SequenceOptions, backends_for
from .segments import LAYOUTS_OF, SEGMENT_LAYOUTS, Result, Route, SegmentPlan

__all__ = [
    "BACKENDS", "LAYOUTS_OF", "RECOMPUTE_MODES", "SEGMENT_LAYOUTS", "Result", "Route", "SegmentPlan",
    "SequenceOptions", "available_backends", "backends_for", "pad", "parallel", "reference", "scan", "segments",
    "triton_backend",
]


def available_backends(device: torch.device | str | None = None, cell: Cell | None = None) -> list[str]:
    """Backends that can run on ``device`` (default: CPU) in this environment; with ``cell``, those serving it."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    names = ["reference", "scan", "pad", "parallel"]
    if triton_backend.is_available(device):
        names.append("triton")
    return names if cell is None else [name for name in names if name in backends_for(cell)]
