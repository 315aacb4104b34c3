"""The LSTM cell: ``torch.nn.LSTM``'s equations and parameters, with the optional output projection ``proj_size``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from .base import (AtenKernels, Carry, LayerWeights, Saved, StepGrads, TorchRNNCell, TritonKernels, register,
                   torch_aten_sequence)

__all__ = ["LSTM", "init_lstm_params"]


def init_lstm_params(input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True, proj_size: int = 0,
                     dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                     generator: torch.Generator | None = None) -> TensorDict:
    """LSTM parameters initialised like ``torch.nn.LSTM`` (uniform in ``[-1/sqrt(H), 1/sqrt(H)]``). Keys for layer
    ``k``: ``weight_ih_l{k} [4H, F_k]``, ``weight_hh_l{k} [4H, P]``, ``bias_ih_l{k}``/``bias_hh_l{k} [4H]`` (with
    ``bias``), ``weight_hr_l{k} [P, H]`` (``proj_size``); ``P = proj_size or H``, ``F_0 = input_size``, ``F_k = P``."""
    return LSTM.init_params(input_size, hidden_size, num_layers, bias, proj_size, dtype, device, generator)


def _aten_step(w: LayerWeights, x: torch.Tensor, carry: Carry) -> Carry:
    return tuple(torch._VF.lstm_cell(x, carry, w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh))


class LSTMCell(TorchRNNCell):
    """``torch.nn.LSTM``: carry ``(h [N, P], c [N, H])``, gates ``i, f, g, o``."""

    name = "lstm"
    title = "LSTM"
    state_names = ("h", "c")
    state_doc = "``(h [*B, L, P], c [*B, L, H])``"
    params_doc = "torch.nn.LSTM state-dict keys (weight_ih_l0, weight_hh_l0, ...)"
    init_function = "init_lstm_params"
    out_dim = "P"
    aten = AtenKernels(sequence=torch_aten_sequence, step=_aten_step, fused_on_cpu=True)
    triton = TritonKernels(is_lstm=True)
    num_gates = 4
    projection = True

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi [N, 4H]``, carry ``(h [N, P], c [N, H])`` -> ``((h', c'), (i, f, g, o))``, the activated gates
        ``[N, H]`` (``tanh(c')`` is recomputed by the backward's elementwise pass); ``extra = (weight_hr,)``."""
        h, c = carry
        i, f, g, o = (gi + F.linear(h, w.weight_hh, w.bias_hh)).chunk(4, dim=-1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c_next = torch.addcmul(i * g, f, c)  # c' = f * c + i * g: the backward recomputes it by the same op
        h_next = o * torch.tanh(c_next)
        (weight_hr,) = w.extra
        if weight_hr is not None:
            h_next = F.linear(h_next, weight_hr)
        return (h_next, c_next), (i, f, g, o)

    def carry_rest_given_h(self, gi: torch.Tensor, h_prev: torch.Tensor, rest0: Carry, w: LayerWeights) -> Carry:
        """``(c [R, T, H],)``: every step's gates at once (they read ``h``, not ``c``), then ``c``'s recurrence."""
        (_, candidate), (_, f, *_) = self.layer_step_saving(gi, (h_prev, torch.zeros_like(h_prev[..., :1])), w)
        c, cs = rest0[0], []  # candidate: i * g
        for f_t, candidate_t in zip(f.unbind(1), candidate.unbind(1)):  # not [:, t]: see backends/reference.py
            c = torch.addcmul(candidate_t, f_t, c)
            cs.append(c)
        return (torch.stack(cs, dim=1),)

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """``(k [.., 4H], a [.., H], f [.., H])`` (and ``o * tanh(c')`` with ``weight_hr``): the gate
        cotangents are ``cat([dc, dc, dc, dh]) * k``, and ``dc = dc' + dh * a``."""
        (i, f, g, o), c = saved, carry[1]
        tanh_c = torch.tanh(torch.addcmul(i * g, f, c))  # tanh(c'), as the forward computed it
        k = torch.cat([g * i * (1 - i), c * f * (1 - f), i * (1 - g * g), tanh_c * o * (1 - o)], dim=-1)
        projected = () if w.extra[0] is None else (o * tanh_c,)
        return (k, o * (1 - tanh_c * tanh_c), f, *projected)

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gh`` equals ``d_gi`` (gates sum both projections); ``d_extra = (d_weight_hr [P, H] | None,)``."""
        (k, a, f, *unprojected), (dh_new, dc_new) = factors, d_new
        (weight_hr,) = w.extra
        d_hr = None
        if weight_hr is not None:
            d_hr = dh_new.transpose(0, 1) @ unprojected[0]
            dh_new = dh_new @ weight_hr
        dc = torch.addcmul(dc_new, dh_new, a)
        d_gates = torch.cat([dc, dc, dc, dh_new], dim=-1) * k
        return StepGrads((d_gates @ w.weight_hh, dc * f), d_gates, None, (d_hr,))


LSTM = register(LSTMCell())
