"""``MinGRUModule`` / ``RGLRUModule``: ``GRUModule``'s conventions over the cells linear in their state."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
from tensordict import TensorDict
from torch import nn

from ..cells import min_gru, rglru
from ..ensemble import _ensemble_init as stacked_init
from ..functional import min_gru_sequence, min_gru_step, rglru_sequence, rglru_step
from .rnn import HYPER, ModuleCell, RecurrentModule

__all__ = ["MinGRUModule", "RGLRUModule"]


class _LinearRecurrence(nn.Module):
    """The weight child of a linear-recurrence module; each subclass sets ``init``, the cell's params init function."""

    init: staticmethod

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, dropout: float = 0.0,
                 batch_first: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if bias is not True:
            raise ValueError(f"{type(self).__name__}: bias=False is not offered (the cell's projection has a bias); "
                             f"drop bias or pass bias=True.")
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.dropout, self.batch_first, self.bidirectional = True, float(dropout), True, False
        for key, value in type(self).init(input_size, hidden_size, num_layers, dtype=dtype, device=device).items():
            self.register_parameter(key, nn.Parameter(value))

    def reset_parameters(self) -> None:
        """Draw every parameter afresh, in place, as the constructor did (``torch.nn.GRU.reset_parameters``'s role)."""
        weight = self.weight_l0
        fresh = type(self).init(self.input_size, self.hidden_size, self.num_layers, dtype=weight.dtype,
                                device=weight.device)
        with torch.no_grad():
            for key, value in fresh.items():
                self.get_parameter(key).copy_(value)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, dropout={self.dropout}"

    @classmethod
    def ensemble_init(cls, num_members: int, input_size: int, hidden_size: int, num_layers: int = 1,
                      bias: bool = True, generator: torch.Generator | None = None) -> TensorDict:
        return stacked_init(cls.init, num_members, input_size, hidden_size, num_layers, generator=generator)


class MinGRU(_LinearRecurrence):
    """minGRU weights (:func:`~rnn_functional.init_min_gru_params`'s names and initialisation)."""

    init = staticmethod(min_gru.init_min_gru_params)


class RGLRU(_LinearRecurrence):
    """RG-LRU weights (:func:`~rnn_functional.init_rglru_params`'s names and initialisation)."""

    init = staticmethod(rglru.init_rglru_params)


class MinGRUModule(RecurrentModule):
    """A minGRU (:func:`~rnn_functional.min_gru_sequence`) with :class:`~rnn_functional.GRUModule`'s conventions.

    Args: ``GRUModule``'s, without ``gru=`` (``bias`` must stay True; ``recurrent_backend`` one of ``"auto"`` (runs
    ``"parallel"``), ``"parallel"``, ``"scan"``, ``"reference"``). ``self.min_gru``, a plain ``torch.nn.Module``,
    holds the weights: ``weight_l{k} [2H, F_k]``, ``bias_l{k} [2H]``. State: ``recurrent_state [*B, L, H]``.
    """

    _cell = ModuleCell("MinGRUModule", MinGRU, "min_gru", HYPER, ("h",), ("recurrent_state",), min_gru.MIN_GRU,
                       min_gru_step, min_gru_sequence, MinGRU.ensemble_init)


class RGLRUModule(RecurrentModule):
    """An RG-LRU (:func:`~rnn_functional.rglru_sequence`) with :class:`~rnn_functional.GRUModule`'s conventions.

    Args: as :class:`MinGRUModule`, and ``segment_start``: ``"scaled"`` (default) or ``"recurrentgemma"``, as
    :func:`~rnn_functional.rglru_sequence` takes it (both modes). ``self.rglru`` holds the weights: ``weight_l{k}
    [3H, F_k]``, ``bias_l{k} [3H]``, ``log_lambda_l{k} [H]``. State: ``recurrent_state [*B, L, H]``.
    """

    _cell = ModuleCell("RGLRUModule", RGLRU, "rglru", HYPER, ("h",), ("recurrent_state",), rglru.RGLRU, rglru_step,
                       rglru_sequence, RGLRU.ensemble_init)

    def __init__(self, *args, segment_start: str = "scaled", **kwargs) -> None:
        core = rglru.rglru_cell(segment_start)
        if core is not rglru.RGLRU:  # this instance's cell, and the public functions called with its option
            object.__setattr__(self, "_cell", replace(
                RGLRUModule._cell, core=core, step=partial(rglru_step, segment_start=segment_start),
                sequence=partial(rglru_sequence, segment_start=segment_start)))
        super().__init__(*args, **kwargs)

    @property
    def segment_start(self) -> str:
        """``"scaled"`` or ``"recurrentgemma"`` (see :func:`~rnn_functional.rglru_sequence`)."""
        return self._cell.core.segment_start
