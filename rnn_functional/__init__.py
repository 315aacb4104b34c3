"""rnn_functional: functional LSTM/GRU with resets, for torch.compile, vmap and TorchRL."""

from .backends import available_backends
from .functional import gru_sequence, gru_step, lstm_sequence, lstm_step
from .modules import GRUModule, LSTMModule, recurrent_mode, set_recurrent_mode
from .params import init_gru_params, init_lstm_params, params_from_module
from .precision import get_recurrent_matmul_precision, set_recurrent_matmul_precision

__all__ = [
    "init_lstm_params",
    "init_gru_params",
    "params_from_module",
    "lstm_step",
    "gru_step",
    "lstm_sequence",
    "gru_sequence",
    "available_backends",
    "LSTMModule",
    "GRUModule",
    "set_recurrent_mode",
    "recurrent_mode",
    "set_recurrent_matmul_precision",
    "get_recurrent_matmul_precision",
]

from .ensemble import ensemble_init_gru_params, ensemble_init_lstm_params, stack_params, unstack_params  # noqa: E402

__all__ += ["stack_params", "unstack_params", "ensemble_init_lstm_params", "ensemble_init_gru_params"]

from .modules.lstm_net import LSTMNet  # noqa: E402

__all__ += ["LSTMNet"]

from .modules.ensemble import EnsembleModule  # noqa: E402

__all__ += ["EnsembleModule"]
