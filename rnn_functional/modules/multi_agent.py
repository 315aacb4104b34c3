"""``MultiAgentGRU`` / ``MultiAgentLSTM``: TorchRL's ``MultiAgentMLP`` conventions for a recurrent cell."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn

from .rnn import GRU_CELL, LSTM_CELL, ModuleCell
from .rnn import recurrent_mode as _context_mode

__all__ = ["MultiAgentGRU", "MultiAgentLSTM"]

Tensor = torch.Tensor


class _MultiAgentRNN(TensorDictModuleBase):
    """What :class:`MultiAgentGRU` and :class:`MultiAgentLSTM` share; each sets the class attributes below."""

    _state_suffixes: tuple[str, ...]
    _cell: ModuleCell  # the functional step, sequence and stacked init

    def __init__(self, n_agent_inputs: int, hidden_size: int, n_agents: int, *, centralized: bool = False,
                 share_params: bool = True, num_layers: int = 1, bias: bool = True,
                 in_key: NestedKey = ("agents", "observation"), out_key: NestedKey = ("agents", "embed"),
                 state_key: str = "recurrent_state", default_recurrent_mode: bool = False,
                 recurrent_backend: str = "auto", recurrent_slice_len: int | None = None,
                 recurrent_num_slices: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("n_agent_inputs", n_agent_inputs), ("hidden_size", hidden_size), ("n_agents", n_agents),
                           ("num_layers", num_layers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}.")
        in_key, out_key = (key if isinstance(key, tuple) else (key,) for key in (in_key, out_key))
        if len(in_key) < 2 or len(out_key) < 2:
            raise ValueError(f"{name}: in_key and out_key must be nested under the agent group, e.g. ('agents', "
                             f"'observation'); got {in_key!r}, {out_key!r}. The group's entries carry the agent dim.")
        if not share_params and (recurrent_slice_len, recurrent_num_slices) != (None, None):
            raise ValueError(f"{name}: recurrent_slice_len/recurrent_num_slices need share_params=True (torch.vmap, "
                             f"which runs per-agent weights, cannot batch the core's slice checks). Pass neither hint.")
        group = in_key[:-1]
        self.n_agent_inputs, self.hidden_size, self.n_agents, self.num_layers = (n_agent_inputs, hidden_size,
                                                                                 n_agents, num_layers)
        self.centralized, self.share_params, self.recurrent_backend = centralized, share_params, recurrent_backend
        self.recurrent_slice_len, self.recurrent_num_slices = recurrent_slice_len, recurrent_num_slices
        # agents are rows of one core call: its segments are every agent's
        self._num_slices = None if recurrent_num_slices is None else recurrent_num_slices * n_agents
        self._recurrent_mode = default_recurrent_mode
        self.group_init_key = (*group, "is_init")
        state_keys = [(*group, state_key + suffix) for suffix in self._state_suffixes]
        self.in_keys = [in_key, *state_keys, self.group_init_key, "is_init"]
        self.out_keys = [out_key, *[("next", *k) for k in state_keys]]
        # nn.GRU / nn.LSTM state-dict names, a leading agent dim with per-agent weights
        width = n_agent_inputs * n_agents if centralized else n_agent_inputs
        members = self._cell.ensemble_init(1 if share_params else n_agents, width, hidden_size, num_layers, bias=bias,
                                           dtype=dtype, device=device, generator=generator)
        self._param_names = tuple(members.keys())
        for k, value in members.items():
            self.register_parameter(k, nn.Parameter(value[0] if share_params else value))

    @property
    def recurrent_mode(self) -> bool:
        """True when the module processes ``[*B, T]`` sequences (``set_recurrent_mode``, else the default)."""
        return _context_mode(bool(self._recurrent_mode))

    def agent_params(self, i: int) -> TensorDict:
        """Agent ``i``'s weights with ``nn.GRU``/``nn.LSTM`` state-dict names, as the functional API takes them
        (the module's own tensors when shared; views of agent ``i``'s slice otherwise)."""
        if not -self.n_agents <= i < self.n_agents:
            raise IndexError(f"{type(self).__name__}: agent {i} out of range for n_agents={self.n_agents}.")
        return TensorDict({k: getattr(self, k) if self.share_params else getattr(self, k)[i]
                           for k in self._param_names}, batch_size=[])

    def make_tensordict_primer(self):
        """A ``torchrl.envs.TensorDictPrimer`` adding zero states ``[*B, n_agents, L, H]`` under the agent group."""
        from torchrl.data import Composite, Unbounded
        from torchrl.envs.transforms import TensorDictPrimer

        dtype = getattr(self, self._param_names[0]).dtype
        shape = (self.n_agents, self.num_layers, self.hidden_size)
        # the group is a Composite of shape [n_agents]: a flat nested key would make it [*B] in the env's specs and
        # fake_tensordict(), which a collector's buffers then fail to stack with the env's [*B, n_agents] group
        spec = Composite({k[-1]: Unbounded(shape=shape, dtype=dtype) for k in self.in_keys[1:-2]}, shape=shape[:1])
        for name in reversed(self.group_init_key[:-1]):
            spec = Composite({name: spec})
        return TensorDictPrimer(spec, expand_specs=True)

    def _read(self, td: TensorDictBase, recurrent: bool) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
        """``(x [*B, n, F], states [*B, n, L, H] (zeros if absent), is_init [*B, n])`` (``[*B, T, ...]`` recurrent)."""
        name, n, in_key = type(self).__name__, self.n_agents, self.in_keys[0]
        lead = list(td.batch_size)
        dims = "[*B, T" if recurrent else "[*B"
        if recurrent and not lead:
            raise ValueError(f"{name} in recurrent mode needs a TensorDict whose last batch dim is time; got "
                             f"batch_size []. Use sequential mode for single steps.")
        x = td.get(in_key, None)
        if x is None:
            raise KeyError(f"{name}: input key {in_key!r} not found in the TensorDict. Store the agents' inputs there "
                           f"({dims}, n_agents={n}, {self.n_agent_inputs}]) or pass in_key=...")
        if list(x.shape) != [*lead, n, self.n_agent_inputs]:
            raise ValueError(
                f"{name}: key {in_key!r} holds shape {list(x.shape)}; expected {[*lead, n, self.n_agent_inputs]} "
                f"({dims}, n_agents, n_agent_inputs], the TensorDict's batch dims then the agent dim). The agent dim "
                f"comes after time: move it with x.movedim(...) or build the TensorDict with batch_size {dims}].")
        dtype = getattr(self, self._param_names[0]).dtype
        if x.dtype != dtype:
            raise TypeError(f"{name}: key {in_key!r} holds dtype {x.dtype}; expected {dtype} (the weights'). Convert "
                            f"the input (e.g. torchrl.envs.DTypeCastTransform) or the module (module.to({x.dtype})).")
        init_key, is_init = self.group_init_key, td.get(self.group_init_key, None)
        expected = ([*lead, n, 1], [*lead, n])
        if is_init is None:
            init_key, is_init, expected = "is_init", td.get("is_init", None), ([*lead, 1], lead)
            if is_init is None:
                raise KeyError(f"{name}: neither {self.group_init_key!r} nor 'is_init' is in the TensorDict. They mark "
                               f"trajectory starts: add torchrl.envs.InitTracker() to the env, or store bool "
                               f"{[*lead, n, 1]} per agent at {self.group_init_key!r}.")
        if is_init.dtype != torch.bool:
            raise TypeError(f"{name}: key {init_key!r} holds dtype {is_init.dtype}; expected torch.bool. Store "
                            f"td[{init_key!r}] = td[{init_key!r}].bool().")
        if list(is_init.shape) not in expected:
            raise ValueError(f"{name}: key {init_key!r} holds shape {list(is_init.shape)}; expected {expected[0]} or "
                             f"{expected[1]} (n_agents={n}). Store one flag per agent and step, the agent dim after "
                             f"the TensorDict's batch dims.")
        is_init = is_init.reshape(*lead, -1).expand(*lead, n)  # the root flag broadcast to every agent
        states = tuple(td.get(k, None) for k in self.in_keys[1:-2])
        want = [*lead, n, self.num_layers, self.hidden_size]
        if all(s is None for s in states):
            return x, tuple(x.new_zeros(want) for _ in states), is_init
        for key, s in zip(self.in_keys[1:-2], states):
            if s is None or list(s.shape) != want:
                raise ValueError(f"{name}: state key {key!r} holds {None if s is None else list(s.shape)}; expected "
                                 f"{want} ({dims}, n_agents, num_layers, hidden_size]). Build env states with "
                                 f"module.make_tensordict_primer() (all state keys or none).")
        return x, states, is_init

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Read the agent group's keys, run one step or a sequence for every agent, write the outputs in place."""
        recurrent = self.recurrent_mode
        x, states, is_init = self._read(tensordict, recurrent)
        n, lead = self.n_agents, tuple(x.shape[:-2])
        if self.centralized:  # every agent reads all agents' inputs, concatenated in agent order
            x = x.flatten(-2).unsqueeze(-2).expand(*lead, n, n * self.n_agent_inputs)
        # agents first: [n, *B(, T), ...], a batch dim of the core's call or the vmapped dim
        x, is_init = x.movedim(-2, 0), is_init.movedim(-1, 0)
        states = tuple(s.movedim(-3, 0) for s in states)
        params = {k: getattr(self, k) for k in self._param_names}
        run = self._run if self.share_params else torch.vmap(self._run, in_dims=(None, 0, 0, 0, 0))
        y, out = run(recurrent, x, states, is_init, params)
        tensordict.set(self.out_keys[0], y.movedim(0, -2))
        for key, s in zip(self.out_keys[1:], out):
            tensordict.set(key, s.movedim(0, -3))
        return tensordict

    def _run(self, recurrent: bool, x: Tensor, states: tuple[Tensor, ...], is_init: Tensor, params: dict):
        packed = states if len(states) > 1 else states[0]
        if recurrent:
            first = tuple(s.select(-3, 0) for s in states)  # the stored state at t = 0
            y, _, new = self._cell.sequence(x, first if len(first) > 1 else first[0], params, is_init=is_init,
                                            reset_state=packed, backend=self.recurrent_backend,
                                            return_segment_states=True, slice_len=self.recurrent_slice_len,
                                            num_slices=self._num_slices)
        else:  # the core's step returns the top layer's h as the output too: the output must not alias the state
            y, new = self._cell.step(x, packed, params, is_init=is_init)
            y = y.clone()
        return y, (new if isinstance(new, tuple) else (new,))


class MultiAgentGRU(_MultiAgentRNN):
    """A GRU per agent over TorchRL's multi-agent TensorDicts (keys and shapes: ``docs/multi_agent.md``).

    Args:
        n_agent_inputs, hidden_size, n_agents: ``F`` (features per agent), ``H``, ``n`` (the agent dim's size).

    Keyword Args:
        centralized: every agent reads all agents' inputs concatenated (input width ``n * F``).
        share_params: one set of weights for all agents (True) or one per agent, run by ``torch.vmap``.
        num_layers, bias: as ``torch.nn.GRU``.
        in_key: the agents' input, nested under the agent group (default ``("agents", "observation")``); the
            state ``(*group, "recurrent_state")`` and ``(*group, "is_init")`` live in the same group.
        out_key: the output (default ``("agents", "embed")``).
        state_key: the state's name in the group (``"recurrent_state"``; the LSTM adds ``_h`` and ``_c``): two
            modules in one policy (an actor's and a critic's) need two names.
        default_recurrent_mode: the mode outside any ``set_recurrent_mode`` context.
        recurrent_backend: the core's ``backend`` in recurrent mode (``"auto"``, ``"scan"``, ``"pad"``, ...).
        recurrent_slice_len, recurrent_num_slices: :class:`~rnn_functional.GRUModule`'s slice hints;
            ``recurrent_num_slices`` counts one agent's segments (slices, and its own resets inside them).
        device, dtype, generator: of the initial weights (``torch.nn.GRU``'s initialisation, one draw per agent).

    Weights are parameters with ``nn.GRU`` state-dict names (``weight_ih_l0``, ...), with a leading agent dim when
    ``share_params=False``; :meth:`agent_params` gives agent ``i``'s.
    """

    _state_suffixes, _cell = ("",), GRU_CELL


class MultiAgentLSTM(_MultiAgentRNN):
    """An LSTM per agent: :class:`MultiAgentGRU`'s arguments, with states ``(*group, "recurrent_state_h")`` and
    ``(*group, "recurrent_state_c")`` and ``nn.LSTM`` state-dict names."""

    _state_suffixes, _cell = ("_h", "_c"), LSTM_CELL
