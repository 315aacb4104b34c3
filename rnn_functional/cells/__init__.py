"""Cells: the bottom layer. One file per cell kind owns its math, parameters and kernel hooks.

:mod:`.base` is the interface every backend talks to (:class:`Cell`, :class:`Layout`,
:class:`LayerWeights`, the hooks) plus the cell-independent math (resets, layer stacking,
segment ends). The cells themselves (``LSTM`` in :mod:`.lstm`, ``GRU`` in :mod:`.gru`,
``NORM_GRU`` in :mod:`.norm_gru`) are imported from their files; the public functions
serving them are registered in :mod:`rnn_functional.functional`.
"""

from .base import (
    CELLS,
    AtenKernels,
    Carry,
    Cell,
    LayerWeights,
    Layout,
    Saved,
    StepGrads,
    TritonKernels,
    apply_reset,
    between_layers,
    broadcast_mask,
    final_at_last_step,
    keep_segment_ends,
    multi_layer_step,
    register,
)

__all__ = [
    "CELLS",
    "AtenKernels",
    "Carry",
    "Cell",
    "LayerWeights",
    "Layout",
    "Saved",
    "StepGrads",
    "TritonKernels",
    "apply_reset",
    "between_layers",
    "broadcast_mask",
    "final_at_last_step",
    "keep_segment_ends",
    "multi_layer_step",
    "register",
]
