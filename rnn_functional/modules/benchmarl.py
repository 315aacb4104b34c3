"""BenchMARL model configs running :class:`~rnn_functional.MultiAgentGRU` / ``MultiAgentLSTM``: one core call per
sequence instead of BenchMARL's loop over time. ``import rnn_functional`` never imports this module (nor BenchMARL)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Optional, Sequence, Type

import torch
from benchmarl.models.common import Model, ModelConfig
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import Composite, Unbounded
from torchrl.modules import MultiAgentMLP

from . import set_recurrent_mode
from .multi_agent import MultiAgentGRU, MultiAgentLSTM

__all__ = ["RecurrentGruConfig", "RecurrentLstmConfig"]


class RecurrentGruModel(Model):
    """BenchMARL ``Model``: a :class:`MultiAgentGRU` then a ``MultiAgentMLP`` head."""

    rnn_class, tag = MultiAgentGRU, "gru"  # the layer, and BenchMARL's name for it in the state keys

    def __init__(self, hidden_size: int, n_layers: int, bias: bool, recurrent_backend: str, **kwargs):
        model_args = {k: kwargs.pop(k) for k in ("input_spec", "output_spec", "agent_group", "input_has_agent_dim",
                                                 "n_agents", "centralised", "share_params", "device", "action_spec",
                                                 "model_index", "is_critic")}
        super().__init__(**model_args)
        self.hidden_size, self.n_layers = hidden_size, n_layers
        in_features = sum(spec.shape[-1] for spec in self.input_spec.values(True, True))
        self.rnn = self.rnn_class(in_features, hidden_size, self.n_agents, centralized=self.centralised,
                       share_params=self.share_params, num_layers=n_layers, bias=bias, in_key=("agents", "x"),
                       out_key=("agents", "y"), state_key="h", recurrent_backend=recurrent_backend, device=self.device)
        self.state_names = state_names(self.rnn_class, self.tag, self.model_index)
        self.rnn_keys = ["is_init", *[(self.agent_group, name) for name in self.state_names]]
        self.in_keys += self.rnn_keys
        self.mlp = MultiAgentMLP(hidden_size, self.output_leaf_spec.shape[-1], self.n_agents,
                                 centralized=self.centralised, share_params=self.share_params, device=self.device,
                                 **{k[4:]: v for k, v in kwargs.items() if k.startswith("mlp_")})

    def _perform_checks(self) -> None:
        super()._perform_checks()
        if not self.input_has_agent_dim:
            raise ValueError(f"{type(self).__name__} needs inputs with the agent dim (a policy or a critic on agents' "
                             f"observations); for a critic on a global state use BenchMARL's GruConfig/LstmConfig.")

    def _forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        x = torch.cat([tensordict.get(k) for k in self.in_keys if k not in self.rnn_keys], dim=-1)
        states = [tensordict.get((self.agent_group, name), None) for name in self.state_names]
        training = states[0] is None  # BenchMARL trains on [B, T] sequences without stored states
        lead = x.shape[:-2]
        td = TensorDict({"agents": TensorDict({"x": x}, [*lead, self.n_agents]), "is_init": tensordict.get("is_init")},
                        lead)
        if not training:
            for key, state in zip(self.rnn.in_keys[1:-2], states):
                td.set(key, state)
        with set_recurrent_mode(training):
            td = self.rnn(td)
        y = self.mlp(td["agents", "y"])
        tensordict.set(self.out_key, y if self.output_has_agent_dim else y[..., 0, :])
        if not training:
            for name, key in zip(self.state_names, self.rnn.out_keys[1:]):
                tensordict.set(("next", self.agent_group, name), td[key])
        return tensordict


class RecurrentLstmModel(RecurrentGruModel):
    """BenchMARL ``Model``: a :class:`MultiAgentLSTM` then a ``MultiAgentMLP`` head."""

    rnn_class, tag = MultiAgentLSTM, "lstm"


def state_names(rnn_class, tag: str, model_index: int) -> list[str]:
    """BenchMARL's names of a model's hidden states (``_hidden_gru_0``; ``_hidden_lstm_h_0``, ``_hidden_lstm_c_0``)."""
    return [f"_hidden_{tag}{suffix}_{model_index}" for suffix in rnn_class._state_suffixes]


@dataclass
class RecurrentGruConfig(ModelConfig):
    """BenchMARL config of a :class:`MultiAgentGRU` model: ``GruConfig``'s fields without ``dropout``/``compile``
    (compile the experiment's policy instead), plus ``recurrent_backend``."""

    hidden_size: int = MISSING
    n_layers: int = MISSING
    mlp_num_cells: Sequence[int] = MISSING
    bias: bool = True
    recurrent_backend: str = "auto"
    mlp_layer_class: Type[nn.Module] = nn.Linear
    mlp_activation_class: Type[nn.Module] = nn.Tanh
    mlp_activation_kwargs: Optional[dict] = None
    mlp_norm_class: Type[nn.Module] = None
    mlp_norm_kwargs: Optional[dict] = None

    @staticmethod
    def associated_class():
        return RecurrentGruModel

    @property
    def is_rnn(self) -> bool:
        return True

    def get_model_state_spec(self, model_index: int = 0) -> Composite:
        model = self.associated_class()
        return Composite({name: Unbounded(shape=(self.n_layers, self.hidden_size))
                          for name in state_names(model.rnn_class, model.tag, model_index)})


@dataclass
class RecurrentLstmConfig(RecurrentGruConfig):
    """BenchMARL config of a :class:`MultiAgentLSTM` model (``RecurrentGruConfig``'s fields)."""

    @staticmethod
    def associated_class():
        return RecurrentLstmModel
