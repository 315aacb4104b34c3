"""The RG-LRU's public functions: the other cells' (:func:`._core.public_functions`) plus ``segment_start``, which
picks one of the two registered RG-LRU cells (:data:`~rnn_functional.cells.rglru.SEGMENT_STARTS`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from ..cells import Layout
from ..cells.rglru import RGLRU, RGLRUCell, rglru_cell
from ._core import entries, public_functions

__all__ = ["rglru_sequence", "rglru_step"]

_SEGMENT_START_DOC = """
        segment_start: ``"scaled"`` (default: a segment's first step is the ordinary step from the reset carry,
            the gated input scaled by ``sqrt(1 - a^2)``) or ``"recurrentgemma"`` (DeepMind's recurrentgemma: scaled
            by 1 at every step where ``is_init`` is True; a call without ``is_init``, or whose first step is not a
            start, keeps the scale there). Served by ``reference``, ``scan`` and ``parallel``."""


def _configured(segment_start: str, layout: Layout | None) -> tuple[RGLRUCell, Layout | None]:
    """The cell for ``segment_start`` and ``layout`` as that cell's (one read by the other RG-LRU cell: same params)."""
    cell = rglru_cell(segment_start)
    return cell, layout if layout is None or layout.cell is cell else replace(layout, cell=cell)


def rglru_step(x: torch.Tensor, state, params: Mapping[str, torch.Tensor], *, is_init: torch.Tensor | None = None,
               backend: str = "auto", dropout: float = 0.0, training: bool = False, layout: Layout | None = None,
               segment_start: str = "scaled"):
    cell, layout = _configured(segment_start, layout)
    return entries(cell)[0](x, state, params, is_init=is_init, backend=backend, dropout=dropout, training=training,
                            layout=layout)


def rglru_sequence(x: torch.Tensor, state, params: Mapping[str, torch.Tensor], *, is_init: torch.Tensor | None = None,
                   reset_state=None, backend: str = "auto", dropout: float = 0.0, training: bool = False,
                   recompute: str = "none", compute_dtype: torch.dtype | None = None, matmul_precision: str | None = None,
                   return_segment_states: bool = False, slice_len: int | None = None, num_slices: int | None = None,
                   segment_layout: str = "auto", layout: Layout | None = None, segment_start: str = "scaled"):
    cell, layout = _configured(segment_start, layout)
    return entries(cell)[1](x, state, params, is_init=is_init, reset_state=reset_state, backend=backend,
                            dropout=dropout, training=training, recompute=recompute, compute_dtype=compute_dtype,
                            matmul_precision=matmul_precision, return_segment_states=return_segment_states,
                            slice_len=slice_len, num_slices=num_slices, segment_layout=segment_layout, layout=layout)


public_functions(RGLRU, (rglru_step, rglru_sequence), _SEGMENT_START_DOC)
