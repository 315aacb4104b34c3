"""Parameter TensorDicts with ``torch.nn.LSTM`` / ``torch.nn.GRU`` state-dict names.

``params`` for layer ``k``:

- ``weight_ih_l{k}``: ``[G * H, F_k]`` (``F_0`` = input size, ``F_k`` = P for k > 0)
- ``weight_hh_l{k}``: ``[G * H, P]``
- ``bias_ih_l{k}``, ``bias_hh_l{k}``: ``[G * H]`` (absent with ``bias=False``)
- ``weight_hr_l{k}``: ``[P, H]`` (LSTM with ``proj_size > 0`` only)

with ``G = 4`` (LSTM) or ``3`` (GRU) and ``P = proj_size`` if > 0 else ``H``.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn

__all__ = ["init_lstm_params", "init_gru_params", "params_from_module"]


def _init_params(
    num_gates: int,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    bias: bool,
    proj_size: int,
    dtype: torch.dtype | None,
    device: torch.device | str | None,
    generator: torch.Generator | None,
) -> TensorDict:
    if input_size <= 0 or hidden_size <= 0 or num_layers <= 0:
        raise ValueError(
            f"input_size, hidden_size and num_layers must be positive, got "
            f"input_size={input_size}, hidden_size={hidden_size}, num_layers={num_layers}."
        )
    if proj_size < 0 or (proj_size and proj_size >= hidden_size):
        raise ValueError(
            f"proj_size must be 0 (no projection) or in [1, hidden_size={hidden_size}), got {proj_size}."
        )
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    out_size = proj_size or hidden_size
    bound = 1.0 / math.sqrt(hidden_size)

    def uniform(*shape: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.uniform_(-bound, bound, generator=generator)

    tensors: dict[str, torch.Tensor] = {}
    for k in range(num_layers):
        layer_in = input_size if k == 0 else out_size
        tensors[f"weight_ih_l{k}"] = uniform(num_gates * hidden_size, layer_in)
        tensors[f"weight_hh_l{k}"] = uniform(num_gates * hidden_size, out_size)
        if bias:
            tensors[f"bias_ih_l{k}"] = uniform(num_gates * hidden_size)
            tensors[f"bias_hh_l{k}"] = uniform(num_gates * hidden_size)
        if proj_size:
            tensors[f"weight_hr_l{k}"] = uniform(proj_size, hidden_size)
    return TensorDict(tensors, batch_size=[], device=device)


def init_lstm_params(
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    *,
    bias: bool = True,
    proj_size: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """LSTM parameters initialised like ``torch.nn.LSTM`` (uniform in ``[-1/sqrt(H), 1/sqrt(H)]``)."""
    return _init_params(4, input_size, hidden_size, num_layers, bias, proj_size, dtype, device, generator)


def init_gru_params(
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    *,
    bias: bool = True,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """GRU parameters initialised like ``torch.nn.GRU`` (uniform in ``[-1/sqrt(H), 1/sqrt(H)]``)."""
    return _init_params(3, input_size, hidden_size, num_layers, bias, 0, dtype, device, generator)


def params_from_module(module: nn.LSTM | nn.GRU) -> TensorDict:
    """The parameters of an ``nn.LSTM`` / ``nn.GRU`` as a TensorDict sharing their storage.

    Gradients computed through the returned TensorDict land in ``module``'s ``.grad``.
    """
    if not isinstance(module, (nn.LSTM, nn.GRU)):
        raise TypeError(
            f"params_from_module expects a torch.nn.LSTM or torch.nn.GRU, got {type(module).__name__}."
        )
    if module.bidirectional:
        raise ValueError(
            "params_from_module: bidirectional modules are not supported (the reset semantics are causal); "
            "build the module with bidirectional=False."
        )
    return TensorDict(dict(module.named_parameters()), batch_size=[])
