"""One spec object per cell kind: everything the modules need to know about a cell.

``LSTMModule``, ``GRUModule``, ``EnsembleModule`` and ``LSTMNet`` read these specs and never
compare cell names: a new cell served by a module is one more :class:`ModuleCell`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict.utils import NestedKey
from torch import nn

from ..cells import Cell
from ..cells.gru import GRU
from ..cells.lstm import LSTM
from ..ensemble import ensemble_init_gru_params, ensemble_init_lstm_params
from ..functional import gru_sequence, gru_step, lstm_sequence, lstm_step

__all__ = ["ModuleCell", "LSTM_CELL", "GRU_CELL"]


@dataclass(frozen=True)
class ModuleCell:
    """A cell kind as the modules see it.

    Attributes:
        module_name: the module class name, prefixed to error messages (``"LSTMModule"``).
        nn_class: the ``torch.nn`` class holding the weights (``nn.LSTM``; a plain module for the linear cells).
        child_attr: the attribute naming that child, TorchRL's name (``"lstm"``).
        hyper_names: the ``nn_class`` constructor hyper-parameters a module exposes.
        state_names: the state tensors, in the core's order (``("h", "c")``).
        default_in_keys / default_out_keys: TorchRL's hidden-state keys after the input/output.
        core: the core's cell (``rnn_functional.cells.lstm.LSTM``): reads and checks the params' layout.
        step / sequence: the functional core (``lstm_step`` / ``lstm_sequence``).
        ensemble_init: stacked initialisation of E members (``ensemble_init_lstm_params``).
        state_widths: ``rnn -> (width of each state)``, e.g. ``(P, H)`` for an LSTM.
    """

    module_name: str
    nn_class: type[nn.Module]
    child_attr: str
    hyper_names: tuple[str, ...]
    state_names: tuple[str, ...]
    default_in_keys: tuple[NestedKey, ...]
    default_out_keys: tuple[NestedKey, ...]
    core: Cell
    step: Callable
    sequence: Callable
    ensemble_init: Callable
    state_widths: Callable[[nn.RNNBase], tuple[int, ...]]

    def pack(self, parts: tuple[torch.Tensor, ...] | None):
        """The core's state form from a tuple of state tensors: the tuple, or its only tensor."""
        if parts is None or len(self.state_names) > 1:
            return parts
        return parts[0]

    def unpack(self, state) -> tuple[torch.Tensor, ...]:
        """The tuple of state tensors from the core's state form (inverse of :meth:`pack`)."""
        return tuple(state) if len(self.state_names) > 1 else (state,)

    def shape_hyper(self, rnn: nn.RNNBase) -> dict:
        """``rnn``'s hyper-parameters that fix the weights' shapes (all but ``dropout``)."""
        return {name: getattr(rnn, name) for name in self.hyper_names if name != "dropout"}


def _lstm_widths(rnn: nn.RNNBase) -> tuple[int, int]:
    return (rnn.proj_size or rnn.hidden_size, rnn.hidden_size)


def gru_widths(rnn: nn.Module) -> tuple[int]:
    return (rnn.hidden_size,)


HYPER = ("input_size", "hidden_size", "num_layers", "bias", "dropout")

LSTM_CELL = ModuleCell(
    module_name="LSTMModule",
    nn_class=nn.LSTM,
    child_attr="lstm",
    hyper_names=(*HYPER, "proj_size"),
    state_names=("h", "c"),
    default_in_keys=("recurrent_state_h", "recurrent_state_c"),
    default_out_keys=(("next", "recurrent_state_h"), ("next", "recurrent_state_c")),
    core=LSTM,
    step=lstm_step,
    sequence=lstm_sequence,
    ensemble_init=ensemble_init_lstm_params,
    state_widths=_lstm_widths,
)

GRU_CELL = ModuleCell(
    module_name="GRUModule",
    nn_class=nn.GRU,
    child_attr="gru",
    hyper_names=HYPER,
    state_names=("h",),
    default_in_keys=("recurrent_state",),
    default_out_keys=(("next", "recurrent_state"),),
    core=GRU,
    step=gru_step,
    sequence=gru_sequence,
    ensemble_init=ensemble_init_gru_params,
    state_widths=gru_widths,
)
