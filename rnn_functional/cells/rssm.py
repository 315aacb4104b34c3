"""The RSSM core of TorchRL's ``RSSMPriorV3(recurrent_model="block_gru")`` (its private ``_DreamerV3BlockGRU``, under
its state-dict names): the block GRU with the input stage docs/model_based.md describes, for ``x = [s, a]``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict

from .block_gru import ACTIVATIONS, BlockGRUCell, block_gru_cell, check_block_sizes

__all__ = ["RSSMCoreCell", "init_rssm_core_params"]


class RSSMCoreCell(BlockGRUCell):
    """Carry ``(h [N, H],)``; :class:`BlockGRUCell`'s layer weights and step, under the private core's names."""

    title = "RSSM core"
    base_name = "rssm_core"
    state_doc = "``belief [*B, 1, H]``"
    params_doc = "TorchRL's RSSMPriorV3(...).rnn state-dict keys (belief_projection.0.weight, ..., gates.bias)"
    init_function = "init_rssm_core_params"
    input_keys = tuple((f"{n}.0.weight", f"{n}.0.bias", f"{n}.1.weight")
                       for n in ("state_projection", "action_projection"))
    hidden_keys = ("belief_projection.0.weight", "belief_projection.0.bias", "belief_projection.1.weight")
    hidden_first = True
    sizes = "state_dim={0}, action_dim={1}, hidden_dim={P}, belief_dim={H}, num_blocks={nb}"

    @staticmethod
    def dynamic_keys(k: int) -> tuple[str, str, str]:
        return f"hidden_layers.{3 * k}.weight", f"hidden_layers.{3 * k}.bias", f"hidden_layers.{3 * k + 1}.weight"

    def prepare_input(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``[p(s), p(a)]`` for every step at once: ``x = [s, a] [..., S + A] -> [..., 2P]``; the action first
        normalised as ``a / max(|a|, 1)``, the denominator without gradient (TorchRL's ``detach``)."""
        s, a = x.split([params["state_projection.0.weight"].shape[-1], params["action_projection.0.weight"].shape[-1]], -1)
        a = a / a.detach().abs().clamp_min(1)
        parts = zip((s, a), self.input_keys)
        return torch.cat([self.project(v, *(params[key] for key in keys)) for v, keys in parts], -1)


def init_rssm_core_params(*, state_dim: int, action_dim: int, hidden_dim: int, belief_dim: int, num_blocks: int = 8,
                          num_layers: int = 1, dtype: torch.dtype | None = None,
                          device: torch.device | str | None = None,
                          generator: torch.Generator | None = None) -> TensorDict:
    """RSSM core parameters under TorchRL's private core's names, initialised as it does (weights truncated normal,
    std ``1.1368 / sqrt(fan_in)``, cut at 2 std; biases zero; norm scales one)."""
    check_block_sizes("belief_dim", state_dim=state_dim, action_dim=action_dim, hidden_dim=hidden_dim,
                      belief_dim=belief_dim, num_blocks=num_blocks, num_layers=num_layers)
    return RSSMCoreCell.init_params((state_dim, action_dim), belief_dim, hidden_dim, num_blocks, num_layers, dtype,
                                    device, generator)


# every activation's default cells, made and registered before any compile
_DEFAULTS = [block_gru_cell(name, kind=kind) for kind in (BlockGRUCell, RSSMCoreCell) for name in ACTIVATIONS]
