"""TensorDict modules over the functional core: drop-in replacements for TorchRL's."""

from ._mode import recurrent_mode, set_recurrent_mode
from .rnn import GRUModule, LSTMModule

__all__ = ["LSTMModule", "GRUModule", "set_recurrent_mode", "recurrent_mode"]
