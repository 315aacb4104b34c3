"""Pure step and sequence functions, one file per cell kind."""

from .gru import gru_sequence, gru_step
from .lstm import lstm_sequence, lstm_step

__all__ = ["lstm_step", "lstm_sequence", "gru_step", "gru_sequence"]
