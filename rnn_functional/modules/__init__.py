"""TensorDict modules over the functional core: drop-in replacements for TorchRL's."""

from .block_gru import DreamerV3BlockGRU, DreamerV3BlockGRUCell
from .linear_rnn import MinGRUModule, RGLRUModule
from .rnn import GRUModule, LSTMModule, recurrent_mode, set_recurrent_mode

__all__ = ["LSTMModule", "GRUModule", "DreamerV3BlockGRUCell", "DreamerV3BlockGRU", "MinGRUModule", "RGLRUModule",
           "set_recurrent_mode", "recurrent_mode"]
