"""The GRU cell (``torch.nn.GRU``'s equations)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from .base import (AtenKernels, Carry, LayerWeights, Saved, StepGrads, TorchRNNCell, TritonKernels, register,
                   torch_aten_sequence)

__all__ = ["GRU", "init_gru_params"]


def init_gru_params(input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True,
                    dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                    generator: torch.Generator | None = None) -> TensorDict:
    """GRU parameters initialised like ``torch.nn.GRU`` (uniform in ``[-1/sqrt(H), 1/sqrt(H)]``). Keys for layer
    ``k``: ``weight_ih_l{k} [3H, F_k]``, ``weight_hh_l{k} [3H, H]`` and, with ``bias``, ``bias_ih_l{k}``/``bias_hh_l{k}
    [3H]``; ``F_0 = input_size``, ``F_k = H`` for ``k > 0``."""
    return GRU.init_params(input_size, hidden_size, num_layers, bias, 0, dtype, device, generator)


def _aten_step(w: LayerWeights, x: torch.Tensor, carry: Carry) -> Carry:
    return (torch._VF.gru_cell(x, carry[0], w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh),)


class GRUCell(TorchRNNCell):
    """``torch.nn.GRU``: carry ``(h [N, H],)``, gates ``r, z, n``."""

    name = "gru"
    title = "GRU"
    params_doc = "torch.nn.GRU state-dict keys (weight_ih_l0, weight_hh_l0, ...)"
    init_function = "init_gru_params"
    aten = AtenKernels(sequence=torch_aten_sequence, step=_aten_step)
    triton = TritonKernels(is_lstm=False)
    num_gates = 3

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi [N, 3H]``, carry ``(h [N, H],)`` -> ``((h',), (r, z, n, h_n))``: the gates and the recurrent
        projection's candidate block, each ``[N, H]``."""
        (h,) = carry
        gh = F.linear(h, w.weight_hh, w.bias_hh)
        hidden = gh.shape[-1] // 3
        r, z = torch.sigmoid(gi[..., : 2 * hidden] + gh[..., : 2 * hidden]).chunk(2, dim=-1)
        h_n = gh[..., 2 * hidden :]
        n = torch.tanh(torch.addcmul(gi[..., 2 * hidden :], r, h_n))
        return (torch.lerp(n, h, z),), (r, z, n, h_n)  # n + z * (h - n)

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """``(k_gi [.., 3H], k_gh [.., 3H], z [.., H])``: ``d_gi = cat([dh, dh, dh]) * k_gi``, likewise ``d_gh``."""
        (r, z, n, h_n), (h,) = saved, carry
        f_n = (1 - z) * (1 - n * n)
        f_r = f_n * h_n * r * (1 - r)
        f_z = (h - n) * z * (1 - z)
        return torch.cat([f_r, f_z, f_n], dim=-1), torch.cat([f_r, f_z, f_n * r], dim=-1), z

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gh [N, 3H]`` differs from ``d_gi`` in its ``n`` block (``r`` scales ``h_n``)."""
        (k_gi, k_gh, z), (dh_new,) = factors, d_new
        dh3 = torch.cat([dh_new, dh_new, dh_new], dim=-1)
        d_gh = dh3 * k_gh
        return StepGrads((torch.addmm(dh_new * z, d_gh, w.weight_hh),), dh3 * k_gi, d_gh, ())


GRU = register(GRUCell())
