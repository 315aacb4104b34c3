"""Cells: the bottom layer. One file per cell kind owns its math, parameters and kernel hooks, and registers itself.

:mod:`.base` is the interface every backend talks to (:class:`Cell`, :class:`Layout`, :class:`LayerWeights`, the
hooks), torch.nn's parameter layout the LSTM and GRU share, and the cell-independent math (resets, layer stacking,
segment ends).
"""

from .base import (CELLS, AtenKernels, Carry, Cell, LayerWeights, Layout, Saved, StepGrads, TritonKernels, apply_reset,
                   between_layers, broadcast_mask, final_at_last_step, keep_segment_ends, multi_layer_step, register)

__all__ = [
    "CELLS", "AtenKernels", "Carry", "Cell", "LayerWeights", "Layout", "Saved", "StepGrads", "TritonKernels",
    "apply_reset", "between_layers", "broadcast_mask", "final_at_last_step", "keep_segment_ends",
    "multi_layer_step", "register",
]
