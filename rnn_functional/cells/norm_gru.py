"""The layer-normalised GRU of DreamerV2/V3 world models (equations: docs/model_based.md). Layer ``k``: ``weight_l{k}
[3H, F_k + H]`` (input first), ``norm_weight_l{k}``/``norm_bias_l{k} [3H]``, layer-norm eps ``1e-3``; no bias."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from .base import (Carry, Cell, LayerWeights, Layout, Saved, StepGrads, check_shapes, check_sizes, count_layers,
                   register, uniform_)

__all__ = ["NORM_GRU", "init_norm_gru_params"]


def init_norm_gru_params(input_size: int, hidden_size: int, num_layers: int = 1, *,
                         dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                         generator: torch.Generator | None = None) -> TensorDict:
    """Layer-normalised GRU parameters: ``weight_l{k} [3H, F_k + H]`` uniform in ``[-1/sqrt(H), 1/sqrt(H)]``
    (as ``torch.nn.GRU``), ``norm_weight_l{k} [3H]`` ones and ``norm_bias_l{k} [3H]`` zeros."""
    check_sizes(input_size, hidden_size, num_layers)
    bound = 1.0 / math.sqrt(hidden_size)
    tensors = {}
    for k in range(num_layers):
        layer_in = input_size if k == 0 else hidden_size
        tensors[f"weight_l{k}"] = uniform_((3 * hidden_size, layer_in + hidden_size), bound, dtype, device, generator)
        tensors[f"norm_weight_l{k}"] = torch.ones(3 * hidden_size, dtype=dtype, device=device)
        tensors[f"norm_bias_l{k}"] = torch.zeros(3 * hidden_size, dtype=dtype, device=device)
    return TensorDict(tensors, batch_size=[], device=device)


class NormGRUCell(Cell):
    """Carry ``(h [N, H],)``; ``weight_ih``/``weight_hh`` are the input/state columns of ``weight_l{k}``,
    ``extra = (norm_weight, norm_bias)``."""

    name = "norm_gru"
    title = "norm GRU"
    params_doc = "norm GRU keys (weight_l0, norm_weight_l0, norm_bias_l0, ...)"
    init_function = "init_norm_gru_params"

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        num_layers = count_layers(set(params.keys()), ("weight_l{k}", "norm_weight_l{k}", "norm_bias_l{k}"), self)
        w0 = params["weight_l0"]
        if w0.ndim != 2 or w0.shape[0] % 3 or w0.shape[1] <= w0.shape[0] // 3:
            raise ValueError(f"params['weight_l0']: expected shape [3 * hidden_size, input_size + hidden_size] for the "
                             f"{self.title}, got {tuple(w0.shape)}. Are these params of another cell kind?")
        hidden = w0.shape[0] // 3
        input_size = w0.shape[1] - hidden
        want = {}
        for k in range(num_layers):
            want[f"weight_l{k}"] = (3 * hidden, (input_size if k == 0 else hidden) + hidden)
            want[f"norm_weight_l{k}"] = want[f"norm_bias_l{k}"] = (3 * hidden,)
        check_shapes(params, want, f"the {self.title} with hidden_size={hidden}, input_size={input_size}", "weight_l0")
        return Layout(self, num_layers, input_size, hidden, (hidden,), w0.dtype, w0.device)

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        w = params[f"weight_l{k}"]
        layer_in = w.shape[-1] - layout.hidden_size
        # contiguous copies: row-major GEMM operands, and no aliased inputs for a scanned step (scan refuses them)
        return LayerWeights(w[..., :layer_in].contiguous(), None, w[..., layer_in:].contiguous(), None,
                            extra=(params[f"norm_weight_l{k}"], params[f"norm_bias_l{k}"]))

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi = x @ weight_ih^T [N, 3H]``, carry ``(h [N, H],)`` -> ``((h',), saved)``; ``saved = (z_hat [N, 3H],
        inv_std [N, 1])``: the normalised pre-activation and its inverse standard deviation."""
        (h,) = carry
        norm_weight, norm_bias = w.extra
        z = gi + F.linear(h, w.weight_hh)
        # eps a literal: a float global becomes a graph input under dynamic=True, which a scan body cannot lift
        z_hat, _, inv_std = torch.native_layer_norm(z, (z.shape[-1],), None, None, 1e-3)
        r, c, u = (z_hat * norm_weight + norm_bias).chunk(3, dim=-1)
        c = torch.tanh(torch.sigmoid(r) * c)
        u = torch.sigmoid(u - 1)
        return (u * c + (1 - u) * h,), (z_hat, inv_std)

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gh`` equals ``d_gi`` (both feed ``z``); ``d_extra = (d_norm_weight, d_norm_bias)``, each ``[3H]``.
        ``factors`` are the saved ``(z_hat, inv_std)``; the gates are recomputed elementwise (no matmul)."""
        (z_hat, inv_std), (h,), (dh_new,) = factors, carry, d_new
        norm_weight, norm_bias = w.extra
        r_in, c_in, u_in = (z_hat * norm_weight + norm_bias).chunk(3, dim=-1)
        r, u = torch.sigmoid(r_in), torch.sigmoid(u_in - 1)
        c = torch.tanh(r * c_in)
        d_rc = dh_new * u * (1 - c * c)  # cotangent of r * c_in
        d_zn = torch.cat([d_rc * c_in * r * (1 - r), d_rc * r, dh_new * (c - h) * u * (1 - u)], dim=-1)
        d_hat = d_zn * norm_weight
        d_z = inv_std * (d_hat - d_hat.mean(-1, keepdim=True) - z_hat * (d_hat * z_hat).mean(-1, keepdim=True))
        d_h = dh_new * (1 - u) + d_z @ w.weight_hh
        return StepGrads((d_h,), d_z, None, ((d_zn * z_hat).sum(0), d_zn.sum(0)))


NORM_GRU = register(NormGRUCell())
