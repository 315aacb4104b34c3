"""rnn_functional: functional LSTM/GRU (and layer-normalised GRU) with resets, for torch.compile, vmap and TorchRL."""

from .ensemble import ensemble_init_gru_params, ensemble_init_lstm_params, stack_params, unstack_params
from .cells.block_gru import init_block_gru_params
from .cells.min_gru import init_min_gru_params
from .cells.norm_gru import init_norm_gru_params
from .cells.rglru import init_rglru_params, rglru_params_from_recurrentgemma
from .cells.rssm import init_rssm_core_params
from .functional import (available_backends, block_gru_sequence, block_gru_step, gru_sequence, gru_step, lstm_sequence, lstm_step,
                         min_gru_sequence, min_gru_step, norm_gru_sequence, norm_gru_step, rglru_sequence, rglru_step,
                         sequence_route)
from .functional.block_gru import rssm_core_sequence, rssm_core_step
from .modules import (DreamerV3BlockGRU, DreamerV3BlockGRUCell, GRUModule, LSTMModule, MinGRUModule, RGLRUModule,
                      recurrent_mode, set_recurrent_mode)
from .modules.ensemble import EnsembleModule
from .modules.lstm_net import LSTMNet
from .modules.multi_agent import MultiAgentGRU, MultiAgentLSTM
from .modules.rssm import RSSMCoreV3
from .params import init_gru_params, init_lstm_params, params_from_module
from .precision import get_recurrent_matmul_precision, set_recurrent_matmul_precision

__all__ = [
    # parameters
    "init_lstm_params", "init_gru_params", "init_norm_gru_params", "init_block_gru_params", "init_min_gru_params",
    "init_rglru_params", "rglru_params_from_recurrentgemma", "init_rssm_core_params", "params_from_module",
    "stack_params", "unstack_params", "ensemble_init_lstm_params", "ensemble_init_gru_params",
    # functions
    "lstm_step", "gru_step", "lstm_sequence", "gru_sequence", "norm_gru_step", "norm_gru_sequence",
    "block_gru_step", "block_gru_sequence", "min_gru_step", "min_gru_sequence", "rglru_step", "rglru_sequence",
    "rssm_core_step", "rssm_core_sequence", "available_backends", "sequence_route",
    "set_recurrent_matmul_precision", "get_recurrent_matmul_precision",
    # modules
    "LSTMModule", "GRUModule", "LSTMNet", "DreamerV3BlockGRUCell", "DreamerV3BlockGRU", "MinGRUModule",
    "RGLRUModule", "RSSMCoreV3", "EnsembleModule", "MultiAgentGRU", "MultiAgentLSTM", "set_recurrent_mode",
    "recurrent_mode",
]
