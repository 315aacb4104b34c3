"""``EnsembleModule``: E copies of a recurrent module, their parameters stacked, run by ``torch.vmap``."""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .linear_rnn import MinGRUModule, RGLRUModule
from .rnn import GRUModule, LSTMModule

__all__ = ["EnsembleModule"]

Member = LSTMModule | GRUModule | MinGRUModule | RGLRUModule


class EnsembleModule(TensorDictModuleBase):
    """An ensemble of ``num_members`` independently initialised copies of ``module``.

    Args:
        module: our ``LSTMModule``, ``GRUModule``, ``MinGRUModule`` or ``RGLRUModule``: the architecture, keys and
            options (left unchanged, its values unused: the members are freshly initialised).
        num_members: E.
        shared_input: True (default): the input TensorDict ``[*B]`` is every member's, read without copies.
            False: the input carries the ensemble dim first, ``[E, *B]``.
        randomness: ``torch.vmap``'s randomness for dropout: ``"different"`` (default: every member draws its own
            masks), ``"same"`` or ``"error"``.
        generator: RNG for the members' initialisation (drawn member after member).

    Input ``[*B]`` (or ``[E, *B]``) -> a new TensorDict ``[E, *B]`` with the wrapped module's output keys added.
    """

    def __init__(self, module: Member, num_members: int, *, shared_input: bool = True, randomness: str = "different",
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(module, Member):
            raise TypeError(f"module: expected an rnn_functional LSTMModule, GRUModule, MinGRUModule or RGLRUModule, "
                            f"got {type(module).__name__}.")
        if randomness not in ("error", "same", "different"):
            raise ValueError(f"randomness: expected one of ['error', 'same', 'different'], got {randomness!r}.")
        cell, rnn = module._cell, module._rnn
        shapes = {name: getattr(rnn, name) for name in cell.hyper_names if name != "dropout"}
        p = next(rnn.parameters())
        members = cell.ensemble_init(num_members, **shapes, generator=generator).to(dtype=p.dtype, device=p.device)
        name = cell.child_attr  # TorchRL's child name: "lstm" / "gru" (ours: "min_gru" / "rglru")
        # plain parameters of a plain child: functional_call swaps them by name, which it cannot inside TensorDictParams
        self.members = torch.nn.Module()
        for key, value in members.items():
            self.members.register_parameter(key, torch.nn.Parameter(value))
        # the wrapped module gives code and config: a copy holding meta leaves (so the ensemble deep-copies)
        with TensorDict.from_module(module).detach().to("meta").to_module(module):
            shell = copy.deepcopy(module)
        object.__setattr__(self, "_template", shell)  # not a child: its meta tensors stay out of state_dict
        self._name, self.num_members, self.shared_input, self.randomness = name, num_members, shared_input, randomness
        self.in_keys, self.out_keys = list(module.in_keys), list(module.out_keys)

    @property
    def module(self) -> Member:
        """The ensemble's copy of the wrapped module (its parameters are on ``meta``; the members' are in ``params``)."""
        return self._template

    @property
    def params(self) -> TensorDict:
        """The members' parameters in the wrapped module's layout, a TensorDict ``[E]`` ``{"lstm" | ...: {...}}`` of
        this module's parameters (``ens.params[e].to_module(single_module)`` runs member ``e`` alone)."""
        return TensorDict({self._name: dict(self.members._parameters)}, batch_size=[self.num_members])

    @params.setter
    def params(self, value: TensorDictBase) -> None:
        """Take the members of ``value`` (e.g. another ensemble's ``params``: its parameters are then shared)."""
        current = self.params
        if not isinstance(value, TensorDictBase) or set(value.keys(True, True)) != set(current.keys(True, True)):
            got = sorted(value.keys(True, True)) if isinstance(value, TensorDictBase) else type(value).__name__
            raise ValueError(f"EnsembleModule.params: expected a TensorDict with keys "
                             f"{sorted(current.keys(True, True))} (another ensemble's params), got {got}.")
        for key, tensor in value[self._name].items():
            if tensor.shape != current[self._name, key].shape:
                raise ValueError(f"EnsembleModule.params[{self._name!r}, {key!r}]: expected shape "
                                 f"{list(current[self._name, key].shape)}, got {list(tensor.shape)}.")
            param = tensor if isinstance(tensor, torch.nn.Parameter) else torch.nn.Parameter(tensor)
            self.members.register_parameter(key, param)

    def member_params(self) -> TensorDictBase:
        """The stacked members' recurrent params (``batch_size [E]``, the functional API's names)."""
        return self.params[self._name]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Run every member on ``tensordict``; returns a new TensorDict ``[E, *B]``."""
        if not self.shared_input and tuple(tensordict.batch_size[:1]) != (self.num_members,):
            raise ValueError(f"EnsembleModule(shared_input=False): expected a TensorDict whose first batch dim is the "
                             f"ensemble dim E={self.num_members}, got batch_size {list(tensordict.batch_size)}. Expand "
                             f"a shared input with td.expand({self.num_members}, *td.batch_size) (a view) or use "
                             f"shared_input=True.")
        module = self._template
        if module.training != self.training:  # train() walks the nn.LSTM child: only when it changes
            module.train(self.training)

        def member(params: dict[str, torch.Tensor], td: TensorDictBase) -> TensorDictBase:
            # explicit weights, not swapped into the child (no graph breaks); a shallow copy leaves the input as it is
            return module.forward_with_params(td.copy(), params)

        in_dims = (0, None if self.shared_input else 0)
        params = dict(self.members._parameters)  # read at call time: functional_call's swaps included
        return torch.vmap(member, in_dims=in_dims, randomness=self.randomness)(params, tensordict)
