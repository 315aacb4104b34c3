"""The public ``{name}_step`` and ``{name}_sequence`` functions: one line per cell builds them (see :mod:`._core`)."""

from ..cells.gru import GRU
from ..cells.lstm import LSTM
from ..cells.min_gru import MIN_GRU
from ..cells.norm_gru import NORM_GRU
from ._core import available_backends, public_functions, sequence_route
from .block_gru import block_gru_sequence, block_gru_step
from .rglru import rglru_sequence, rglru_step

lstm_step, lstm_sequence = public_functions(LSTM)
gru_step, gru_sequence = public_functions(GRU)
norm_gru_step, norm_gru_sequence = public_functions(NORM_GRU)
min_gru_step, min_gru_sequence = public_functions(MIN_GRU)

__all__ = ["available_backends", "sequence_route", "lstm_step", "lstm_sequence", "gru_step", "gru_sequence", "norm_gru_step", "norm_gru_sequence",
           "block_gru_step", "block_gru_sequence", "min_gru_step", "min_gru_sequence", "rglru_step", "rglru_sequence"]
