"""``MinGRUModule`` / ``RGLRUModule``: ``GRUModule``'s conventions over the cells linear in their state.

Same constructor arguments (those that apply: no ``gru=``), keys (``recurrent_state`` /
``("next", "recurrent_state")``, ``is_init``), shapes, modes (TorchRL's ``set_recurrent_mode``), primers
and options as :class:`~rnn_functional.GRUModule`, so a TorchRL pipeline swaps one for the other with no
other change. The weights live in a plain ``torch.nn.Module`` child (``self.min_gru`` / ``self.rglru``) whose
parameters carry the functional API's names (``weight_l0``, ``bias_l0``, ``log_lambda_l0``, ...).
Recurrent mode runs ``recurrent_backend="auto"``: the ``parallel`` backend, in every context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey
from torch import nn

from ..cells import min_gru, rglru
from ..ensemble import _ensemble_init as stacked_init
from ..functional import min_gru_sequence, min_gru_step, rglru_sequence, rglru_step
from ._cells import HYPER, ModuleCell, gru_widths
from .rnn import _RecurrentModule

__all__ = ["MinGRUModule", "RGLRUModule"]


class _LinearRecurrence(nn.Module):
    """The weight child of a linear-recurrence module; each subclass sets ``init``, the cell's params init function."""

    init: staticmethod

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, dropout: float = 0.0,
                 batch_first: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if bias is not True:
            raise ValueError(f"{type(self).__name__}: bias=False is not offered (the cell's projection has a bias); "
                             f"drop bias or pass bias=True.")
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.dropout, self.batch_first, self.bidirectional = True, float(dropout), True, False
        for key, value in type(self).init(input_size, hidden_size, num_layers, dtype=dtype, device=device).items():
            self.register_parameter(key, nn.Parameter(value))

    def reset_parameters(self) -> None:
        """Draw every parameter afresh, in place, as the constructor did (``torch.nn.GRU.reset_parameters``'s role)."""
        weight = self.weight_l0
        fresh = type(self).init(self.input_size, self.hidden_size, self.num_layers, dtype=weight.dtype,
                                device=weight.device)
        with torch.no_grad():
            for key, value in fresh.items():
                self.get_parameter(key).copy_(value)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, dropout={self.dropout}"


class MinGRU(_LinearRecurrence):
    """minGRU weights (:func:`~rnn_functional.init_min_gru_params`'s names and initialisation)."""

    init = staticmethod(min_gru.init_min_gru_params)


class RGLRU(_LinearRecurrence):
    """RG-LRU weights (:func:`~rnn_functional.init_rglru_params`'s names and initialisation)."""

    init = staticmethod(rglru.init_rglru_params)


def _ensemble_init(init):
    """``ModuleCell.ensemble_init`` for ``init`` (the cells have no ``bias`` option: it is always True)."""
    def ensemble_init(num_members: int, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                      generator: torch.Generator | None = None) -> TensorDict:
        return stacked_init(init, num_members, input_size, hidden_size, num_layers, generator=generator)

    return ensemble_init


def _spec(module_name: str, nn_class: type[nn.Module], child_attr: str, core, step, sequence) -> ModuleCell:
    return ModuleCell(module_name=module_name, nn_class=nn_class, child_attr=child_attr, hyper_names=HYPER,
                      state_names=("h",), default_in_keys=("recurrent_state",),
                      default_out_keys=(("next", "recurrent_state"),), core=core, step=step, sequence=sequence,
                      ensemble_init=_ensemble_init(nn_class.init), state_widths=gru_widths)


MIN_GRU_CELL = _spec("MinGRUModule", MinGRU, "min_gru", min_gru.MIN_GRU, min_gru_step, min_gru_sequence)
RGLRU_CELL = _spec("RGLRUModule", RGLRU, "rglru", rglru.RGLRU, rglru_step, rglru_sequence)


class _LinearRecurrentModule(_RecurrentModule):
    """:class:`~rnn_functional.GRUModule`'s constructor without ``gru=``; each subclass sets ``_cell``."""

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0,
        bidirectional: bool = False,
        python_based: bool = False,
        recurrent_backend: str = "auto",
        recurrent_compute_dtype: torch.dtype | None = None,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        default_recurrent_mode: bool | None = None,
        recurrent_slice_len: int | None = None,
        recurrent_num_slices: int | None = None,
    ) -> None:
        super().__init__()
        given = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias, dropout=dropout)
        self._setup(None, given, batch_first=batch_first, bidirectional=bidirectional, python_based=python_based,
                    recurrent_backend=recurrent_backend, recurrent_compute_dtype=recurrent_compute_dtype,
                    recurrent_recompute=recurrent_recompute, recurrent_matmul_precision=recurrent_matmul_precision,
                    in_key=in_key, in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device,
                    default_recurrent_mode=default_recurrent_mode, recurrent_slice_len=recurrent_slice_len,
                    recurrent_num_slices=recurrent_num_slices)


class MinGRUModule(_LinearRecurrentModule):
    """A minGRU (:func:`~rnn_functional.min_gru_sequence`) with :class:`~rnn_functional.GRUModule`'s conventions.

    Args: ``GRUModule``'s, without ``gru=`` (``bias`` must stay True; ``recurrent_backend`` one of ``"auto"``,
    ``"parallel"``, ``"scan"``, ``"reference"``). ``self.min_gru`` holds the weights: ``weight_l{k} [2H, F_k]``,
    ``bias_l{k} [2H]``. State: ``recurrent_state [*B, L, H]``.
    """

    _cell = MIN_GRU_CELL
    DEFAULT_IN_KEYS = list(MIN_GRU_CELL.default_in_keys)
    DEFAULT_OUT_KEYS = list(MIN_GRU_CELL.default_out_keys)


class RGLRUModule(_LinearRecurrentModule):
    """An RG-LRU (:func:`~rnn_functional.rglru_sequence`) with :class:`~rnn_functional.GRUModule`'s conventions.

    Args: as :class:`MinGRUModule`. ``self.rglru`` holds the weights: ``weight_l{k} [3H, F_k]``, ``bias_l{k} [3H]``,
    ``log_lambda_l{k} [H]``. State: ``recurrent_state [*B, L, H]``.
    """

    _cell = RGLRU_CELL
    DEFAULT_IN_KEYS = list(RGLRU_CELL.default_in_keys)
    DEFAULT_OUT_KEYS = list(RGLRU_CELL.default_out_keys)
