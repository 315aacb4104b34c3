"""rnn_functional: functional LSTM/GRU with resets, for torch.compile, vmap and TorchRL."""

from .backends import available_backends
from .functional import gru_sequence, gru_step, lstm_sequence, lstm_step
from .params import init_gru_params, init_lstm_params, params_from_module

__all__ = [
    "init_lstm_params",
    "init_gru_params",
    "params_from_module",
    "lstm_step",
    "gru_step",
    "lstm_sequence",
    "gru_sequence",
    "available_backends",
]
