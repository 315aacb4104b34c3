"""Parameter TensorDicts of ``torch.nn``'s cells: their init functions, and views of ``torch.nn`` modules.

LSTM/GRU params carry ``torch.nn.LSTM`` / ``torch.nn.GRU`` state-dict names (see
:mod:`rnn_functional.cells.lstm` and :mod:`rnn_functional.cells.gru`).
"""

from __future__ import annotations

from tensordict import TensorDict
from torch import nn

from .cells.gru import init_gru_params
from .cells.lstm import init_lstm_params

__all__ = ["init_lstm_params", "init_gru_params", "params_from_module"]


def params_from_module(module: nn.LSTM | nn.GRU) -> TensorDict:
    """The parameters of an ``nn.LSTM`` / ``nn.GRU`` as a TensorDict sharing their storage.

    Any ``nn.RNNBase`` in LSTM or GRU mode serves, as the modules' ``lstm=``/``gru=`` accept: e.g. TorchRL's
    Python ``torchrl.modules.LSTM``/``GRU`` (the child of its ``python_based`` modules), which hold the same
    parameters under the same names. Gradients computed through the returned TensorDict land in ``module``'s
    ``.grad``.
    """
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
