"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?"): a GRU whose gates read the input only (equations:
docs/linear_recurrences.md)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from ._linear_rnn import LinearRecurrentCell, init_linear_params
from .base import Carry, LayerWeights, Saved, StepGrads, register

__all__ = ["MIN_GRU", "init_min_gru_params"]


class MinGRUCell(LinearRecurrentCell):
    """minGRU: ``weight_l{k} [2H, F_k]``, ``bias_l{k} [2H]`` (rows: gate, then candidate)."""

    name = "min_gru"
    title = "minGRU"
    gates = 2
    params_doc = "keys weight_l{k} [2H, F_k], bias_l{k} [2H] per layer k"
    init_function = "init_min_gru_params"

    def coefficients(self, gi: torch.Tensor, w: LayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        gate, cand = gi.chunk(2, dim=-1)
        return torch.sigmoid(-gate), torch.sigmoid(gate) * cand  # 1 - z without cancellation

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        (gi,), (h,), (g,) = factors, carry, d_new
        gate, cand = gi.chunk(2, dim=-1)
        z = torch.sigmoid(gate)
        d_gate = g * (cand - h) * z * (1 - z)  # b - a*h's derivative in z, through sigmoid
        return StepGrads((g * (1 - z),), torch.cat([d_gate, g * z], dim=-1), None, ())


MIN_GRU = register(MinGRUCell())


def init_min_gru_params(input_size: int, hidden_size: int, num_layers: int = 1, *,
                        dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                        generator: torch.Generator | None = None) -> TensorDict:
    """minGRU params initialised like ``torch.nn.Linear``: ``weight_l{k} [2H, F_k]``, ``bias_l{k} [2H]``, uniform in
    ``[-1/sqrt(F_k), 1/sqrt(F_k)]``; ``F_0 = input_size``, ``F_k = hidden_size`` for ``k > 0``."""
    return init_linear_params(MIN_GRU, input_size, hidden_size, num_layers, dtype, device, generator, None)

