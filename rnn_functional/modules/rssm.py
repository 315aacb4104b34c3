"""``RSSMCoreV3``: a drop-in for the core TorchRL's ``RSSMPriorV3(recurrent_model="block_gru")`` builds (its private
``_DreamerV3BlockGRU``: same submodules, state-dict names and random draws) over ``rssm_core_step``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..cells.block_gru import init_weight_
from ..functional.block_gru import rssm_core_step
from .block_gru import ACTIVATION_NAMES, _BlockLinear, _Scale, activation_of

__all__ = ["RSSMCoreV3"]


class RSSMCoreV3(nn.Module):
    """DreamerV3's RSSM core as TorchRL ships it: ``forward(state [*B, S], belief [*B, H], action [*B, A]) -> belief'``.

    Args (keywords, as TorchRL's private core): ``state_dim`` (``num_categoricals * num_classes``), ``action_dim``,
    ``hidden_dim`` (the projections' width), ``belief_dim``, ``num_blocks``, ``num_layers`` (dynamics layers),
    ``norm_eps``, ``device``; ours: ``activation_class`` (any parameter-free elementwise one) and ``backend``.
    """

    def __init__(self, *, state_dim: int, action_dim: int, hidden_dim: int, belief_dim: int, num_blocks: int,
                 num_layers: int, norm_eps: float, device: torch.device | str | int | None = None,
                 activation_class: type[nn.Module] | Callable = nn.SiLU, backend: str = "auto"):
        super().__init__()
        if belief_dim % num_blocks:
            raise ValueError(f"rnn_hidden_dim must be divisible by num_blocks, got {belief_dim} and {num_blocks}.")
        self.belief_dim, self.num_blocks, self.norm_eps, self.backend = belief_dim, num_blocks, norm_eps, backend
        self.activation = activation_of(activation_class)

        def projection(width: int) -> nn.Sequential:
            return nn.Sequential(nn.Linear(width, hidden_dim, device=device), _Scale(hidden_dim, norm_eps, device),
                                 self.activation)

        # built in TorchRL's order, the projections re-initialised last as its ``apply`` does: the same draws
        self.belief_projection, self.state_projection, self.action_projection = map(
            projection, (belief_dim, state_dim, action_dim))
        layers, width = [], belief_dim + 3 * hidden_dim * num_blocks
        for _ in range(num_layers):
            layers += [_BlockLinear(width, belief_dim, num_blocks, device), _Scale(belief_dim, norm_eps, device),
                       self.activation]
            width = belief_dim
        self.hidden_layers = nn.Sequential(*layers)
        self.gates = _BlockLinear(belief_dim, 3 * belief_dim, num_blocks, device)
        with torch.no_grad():
            for linear in (self.belief_projection[0], self.state_projection[0], self.action_projection[0]):
                init_weight_(linear.weight, linear.in_features)
                linear.bias.zero_()

    @classmethod
    def from_torchrl(cls, core: nn.Module, **kwargs) -> RSSMCoreV3:
        """Ours over TorchRL's core's own parameter objects (nothing copied, no random draw): ``prior.rnn =
        RSSMCoreV3.from_torchrl(prior.rnn)``. ``kwargs``: ``activation_class``, ``backend``."""
        linear, norm = core.belief_projection[0], core.belief_projection[1]
        ours = cls(state_dim=core.state_projection[0].in_features, action_dim=core.action_projection[0].in_features,
                   hidden_dim=linear.out_features, belief_dim=core.belief_dim, num_blocks=core.num_blocks,
                   num_layers=len(core.hidden_layers) // 3, norm_eps=norm.eps, device="meta", **kwargs)
        ours.load_state_dict(core.state_dict(keep_vars=True), strict=True, assign=True)
        return ours

    def forward(self, state: torch.Tensor, belief: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        activation = ACTIVATION_NAMES.get(type(self.activation), self.activation)
        _, h = rssm_core_step(torch.cat([state, action], -1), belief.unsqueeze(-2), dict(self.named_parameters()),
                              backend=self.backend, activation=activation, norm_eps=self.norm_eps)
        return h.squeeze(-2)
