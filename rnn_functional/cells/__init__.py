"""Cells: the bottom layer. One file per cell kind owns its math, parameters and kernel hooks, and registers itself;
:mod:`.base` holds the interface every backend talks to and the cell-independent math."""

from .base import (CELLS, AtenKernels, Carry, Cell, LayerWeights, Layout, Saved, StepGrads, TritonKernels, apply_reset,
                   between_layers, final_at_last_step, keep_segment_ends, multi_layer_step, register)

__all__ = ["CELLS", "AtenKernels", "Carry", "Cell", "LayerWeights", "Layout", "Saved", "StepGrads", "TritonKernels",
           "apply_reset", "between_layers", "final_at_last_step", "keep_segment_ends", "multi_layer_step", "register"]
