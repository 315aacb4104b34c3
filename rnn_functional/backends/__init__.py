"""Backends: run a cell over time. They import cells, never the public API.

Every backend serves the canonical call of :mod:`.base` and computes exactly what
``reference`` does. Which backend serves a call is decided above, in
:mod:`rnn_functional.functional.selection`.
"""

from __future__ import annotations

import torch

from . import pad, reference, scan
from . import triton as triton_backend
from .base import BACKENDS, RECOMPUTE_MODES, SequenceOptions, backends_for
from .recompute import checkpointed

SEQUENCE = {"reference": reference.sequence, "scan": scan.sequence, "pad": pad.sequence}

__all__ = [
    "BACKENDS",
    "RECOMPUTE_MODES",
    "SEQUENCE",
    "SequenceOptions",
    "available_backends",
    "backends_for",
    "checkpointed",
    "pad",
    "reference",
    "scan",
    "triton_backend",
]


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Backends that can run on ``device`` (default: CPU) in this environment."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    names = ["reference", "scan", "pad"]
    if triton_backend.is_available(device):
        names.append("triton")
    return names
