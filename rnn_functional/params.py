"""Parameter TensorDicts with ``torch.nn.LSTM`` / ``torch.nn.GRU`` state-dict names: init functions, and views of
``torch.nn`` modules."""

from __future__ import annotations

from tensordict import TensorDict
from torch import nn

from .cells.gru import init_gru_params
from .cells.lstm import init_lstm_params

__all__ = ["init_lstm_params", "init_gru_params", "params_from_module"]


def params_from_module(module: nn.LSTM | nn.GRU) -> TensorDict:
    """The parameters of an ``nn.LSTM`` / ``nn.GRU`` (any ``nn.RNNBase`` in LSTM or GRU mode, e.g. TorchRL's
    Python ``LSTM``/``GRU``) as a TensorDict sharing their storage: gradients through it land in ``module``'s
    ``.grad``."""
    if not (isinstance(module, nn.RNNBase) and module.mode in (nn.LSTM.__name__, nn.GRU.__name__)):  # as build_rnn
        kind = type(module)
        mode = f" in mode {module.mode!r}" if isinstance(module, nn.RNNBase) else ""
        raise TypeError(
            f"params_from_module(module): expected a torch.nn.LSTM or torch.nn.GRU (or another nn.RNNBase in LSTM "
            f"or GRU mode), got {kind.__module__}.{kind.__qualname__}{mode}. Pass the recurrent layer itself, e.g. "
            f"the .lstm/.gru child of an LSTMModule/GRUModule."
        )
    if module.bidirectional:
        raise ValueError(
            "params_from_module: bidirectional modules are not supported (the reset semantics are causal); "
            "build the module with bidirectional=False."
        )
    return TensorDict(dict(module.named_parameters()), batch_size=[])
