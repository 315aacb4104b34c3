"""The RSSM core of TorchRL's ``RSSMPriorV3(recurrent_model="block_gru")`` (its private ``_DreamerV3BlockGRU``).

The block GRU (:mod:`.block_gru`) with another input stage: belief ``h [N, H]``, stochastic state ``s [N, S]`` and
action ``a [N, A]`` are projected separately, ``p(v) = act(rms(v @ W^T + b) * n)`` (width ``P`` each), the action
first normalised as ``a / max(|a|, 1)`` (the denominator without gradient, as TorchRL's ``detach``), and the first
dynamics layer's block ``j`` reads ``[h_j, p(h), p(s), p(a)]``. Everything after is the block GRU's step and its
hand-written backward. The call's ``x`` is ``[s, a]`` (``[N, S + A]``): ``p(s)`` and ``p(a)`` depend on it alone and
run over the whole sequence at once (:meth:`RSSMCoreCell.prepare_input`). Parameters carry the private core's
state-dict names (``belief_projection.0.weight``, ..., ``hidden_layers.{3k}.weight``, ``gates.bias``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from .base import Layout, check_keys, check_shapes
from .block_gru import ACTIVATIONS, BlockGRUCell, block_gru_cell, init_weight_

__all__ = ["RSSMCoreCell", "init_rssm_core_params"]

PROJECTIONS = ("belief_projection", "state_projection", "action_projection")


def _layers(keys) -> int:
    k = 0
    while f"hidden_layers.{3 * k}.weight" in keys:
        k += 1
    return k


class RSSMCoreCell(BlockGRUCell):
    """Carry ``(h [N, H],)``; :class:`BlockGRUCell`'s layer weights and step, under the private core's names."""

    title = "RSSM core"
    base_name = "rssm_core"
    state_doc = "``belief [*B, 1, H]``"
    params_doc = "TorchRL's RSSMPriorV3(...).rnn state-dict keys (belief_projection.0.weight, ..., gates.bias)"
    init_function = "init_rssm_core_params"
    hidden_keys = ("belief_projection.0.weight", "belief_projection.0.bias", "belief_projection.1.weight")
    hidden_first = True

    @staticmethod
    def dynamic_keys(k: int) -> tuple[str, str, str]:
        return f"hidden_layers.{3 * k}.weight", f"hidden_layers.{3 * k}.bias", f"hidden_layers.{3 * k + 1}.weight"

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        keys, layers = set(params.keys()), _layers(params.keys())
        expected = {f"{name}.{i}.{t}" for name in PROJECTIONS for i, t in ((0, "weight"), (0, "bias"), (1, "weight"))}
        expected |= {key for k in range(max(layers, 1)) for key in self.dynamic_keys(k)} | {"gates.weight", "gates.bias"}
        check_keys(keys, expected, f"an {self.title} with {max(layers, 1)} dynamics layer(s)")
        gates, P = params["gates.weight"], params["belief_projection.0.weight"].shape[0]
        S, A = params["state_projection.0.weight"].shape[-1], params["action_projection.0.weight"].shape[-1]
        if gates.ndim != 3:
            raise ValueError(f"params['gates.weight']: expected shape [nb, H/nb, 3H/nb], got {list(gates.shape)}.")
        nb, hb = gates.shape[:2]
        want = {"gates.weight": (nb, hb, 3 * hb), "gates.bias": (3 * nb * hb,)}
        for name, width in zip(PROJECTIONS, (nb * hb, S, A)):
            want.update({f"{name}.0.weight": (P, width), f"{name}.0.bias": (P,), f"{name}.1.weight": (P,)})
        for k in range(layers):
            want.update(zip(self.dynamic_keys(k), ((nb, hb + 3 * P if k == 0 else hb, hb), (nb * hb,), (nb * hb,))))
        check_shapes(params, want, f"the {self.title} with state_dim={S}, action_dim={A}, hidden_dim={P}, "
                     f"belief_dim={nb * hb}, num_blocks={nb}", "belief_projection.0.weight")
        weight = params["state_projection.0.weight"]
        return Layout(self, 1, S + A, nb * hb, (nb * hb,), weight.dtype, weight.device, bias=True)

    def prepare_input(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``[p(s), p(a)]`` for every step at once: ``x = [s, a] [..., S + A] -> [..., 2P]``."""
        s, a = x.split([params["state_projection.0.weight"].shape[-1], params["action_projection.0.weight"].shape[-1]], -1)
        a = a / a.detach().abs().clamp_min(1)
        return torch.cat([self.project(v, params[f"{n}.0.weight"], params[f"{n}.0.bias"], params[f"{n}.1.weight"])
                          for v, n in ((s, "state_projection"), (a, "action_projection"))], -1)


def init_rssm_core_params(
    *,
    state_dim: int,
    action_dim: int,
    hidden_dim: int,
    belief_dim: int,
    num_blocks: int = 8,
    num_layers: int = 1,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """RSSM core parameters under TorchRL's private core's names, initialised as it does (weights truncated normal,
    std ``1.1368 / sqrt(fan_in)``, cut at 2 std; biases zero; norm scales one)."""
    for name, value in (("state_dim", state_dim), ("action_dim", action_dim), ("hidden_dim", hidden_dim),
                        ("belief_dim", belief_dim), ("num_blocks", num_blocks), ("num_layers", num_layers)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}.")
    if belief_dim % num_blocks:
        raise ValueError(f"belief_dim must be divisible by num_blocks, got {belief_dim} and {num_blocks}.")
    H, P, nb = belief_dim, hidden_dim, num_blocks
    dtype = dtype if dtype is not None else torch.get_default_dtype()

    def weight(shape, fan_in):
        return init_weight_(torch.empty(shape, dtype=dtype, device=device), fan_in, generator)

    zeros = functools.partial(torch.zeros, dtype=dtype, device=device)
    ones = functools.partial(torch.ones, dtype=dtype, device=device)
    tensors = {}
    for name, width in zip(PROJECTIONS, (H, state_dim, action_dim)):
        tensors.update({f"{name}.0.weight": weight((P, width), width), f"{name}.0.bias": zeros(P),
                        f"{name}.1.weight": ones(P)})
    for k in range(num_layers):
        fan_in = H + 3 * P * nb if k == 0 else H
        w, b, n = RSSMCoreCell.dynamic_keys(k)
        tensors.update({w: weight((nb, fan_in // nb, H // nb), fan_in), b: zeros(H), n: ones(H)})
    tensors.update({"gates.weight": weight((nb, H // nb, 3 * H // nb), H), "gates.bias": zeros(3 * H)})
    return TensorDict(tensors, batch_size=[], device=device)


for _name in ACTIVATIONS:  # the defaults of every activation, made and registered here, before any compile
    block_gru_cell(_name, kind=RSSMCoreCell)
del _name
