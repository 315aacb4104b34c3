"""Reading hyper-parameters from a params TensorDict, and validating them.

Every public function derives ``num_layers``, ``H``, ``P``, bias and projection from the
params' keys and shapes; nothing else configures a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

NUM_GATES = {"lstm": 4, "gru": 3}
CELL_NAMES = {"lstm": "LSTM", "gru": "GRU"}


@dataclass(frozen=True)
class Layout:
    """Static description of a stack of recurrent layers, read from its params."""

    cell: str  # "lstm" or "gru"
    num_layers: int
    input_size: int
    hidden_size: int
    proj_size: int  # 0 when there is no projection
    bias: bool
    dtype: torch.dtype
    device: torch.device

    @property
    def out_size(self) -> int:
        """P: width of the output and of ``h``."""
        return self.proj_size or self.hidden_size

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Width of each state tensor: ``(P, H)`` for LSTM, ``(H,)`` for GRU."""
        return (self.out_size, self.hidden_size) if self.cell == "lstm" else (self.hidden_size,)


@dataclass(frozen=True)
class LayerWeights:
    """The weights of one layer; optional entries are ``None``."""

    weight_ih: torch.Tensor
    weight_hh: torch.Tensor
    bias_ih: torch.Tensor | None
    bias_hh: torch.Tensor | None
    weight_hr: torch.Tensor | None


def layer_weights(params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
    """Weights of layer ``k``."""
    return LayerWeights(
        weight_ih=params[f"weight_ih_l{k}"],
        weight_hh=params[f"weight_hh_l{k}"],
        bias_ih=params[f"bias_ih_l{k}"] if layout.bias else None,
        bias_hh=params[f"bias_hh_l{k}"] if layout.bias else None,
        weight_hr=params[f"weight_hr_l{k}"] if layout.proj_size else None,
    )


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def as_tensor_map(params, cell: str) -> dict[str, torch.Tensor]:
    """``params`` (a TensorDict or a mapping) as a plain dict: cheap repeated key access."""
    if not isinstance(params, Mapping) and not hasattr(params, "items"):
        raise TypeError(
            f"params must be a TensorDict (or a mapping) with torch.nn.{CELL_NAMES[cell]} state-dict keys, "
            f"got {type(params).__name__}. Build one with init_{cell}_params(...) or params_from_module(...)."
        )
    return dict(params.items())


def read_layout(params: Mapping[str, torch.Tensor], cell: str) -> Layout:
    """Validate ``params`` for ``cell`` and return its layout.

    Raises ``KeyError``/``ValueError`` naming the key, the expected and the actual shape.
    """
    name = CELL_NAMES[cell]
    keys = set(params.keys())
    num_layers = 0
    while f"weight_ih_l{num_layers}" in keys:
        num_layers += 1
    if num_layers == 0:
        raise KeyError(
            f"params: missing key 'weight_ih_l0'; expected torch.nn.{name} state-dict keys "
            f"(weight_ih_l0, weight_hh_l0, ...), got {sorted(keys)}."
        )
    bias = "bias_ih_l0" in keys
    proj = "weight_hr_l0" in keys
    if proj and cell == "gru":
        raise ValueError("params: 'weight_hr_l0' is an LSTM projection weight; GRU has no proj_size.")
    expected = set()
    for k in range(num_layers):
        expected |= {f"weight_ih_l{k}", f"weight_hh_l{k}"}
        if bias:
            expected |= {f"bias_ih_l{k}", f"bias_hh_l{k}"}
        if proj:
            expected.add(f"weight_hr_l{k}")
    missing, extra = expected - keys, keys - expected
    if missing:
        raise KeyError(
            f"params: missing key(s) {sorted(missing)} for a {num_layers}-layer {name} "
            f"(bias={bias}, proj={proj}); got keys {sorted(keys)}."
        )
    if extra:
        raise KeyError(
            f"params: unexpected key(s) {sorted(extra)} for a {num_layers}-layer {name} "
            f"(bias={bias}, proj={proj}); expected exactly {sorted(expected)}."
        )

    gates = NUM_GATES[cell]
    w_hh0 = params["weight_hh_l0"]
    w_ih0 = params["weight_ih_l0"]
    if w_hh0.ndim != 2 or w_hh0.shape[0] % gates:
        raise ValueError(
            f"params['weight_hh_l0']: expected shape [{gates} * hidden_size, P] for {name}, "
            f"got {_shape(w_hh0)}. Are these params of another cell kind?"
        )
    hidden = w_hh0.shape[0] // gates
    proj_size = params["weight_hr_l0"].shape[0] if proj else 0
    out = proj_size or hidden
    input_size = w_ih0.shape[-1]
    dtype, device = w_hh0.dtype, w_hh0.device
    for k in range(num_layers):
        layer_in = input_size if k == 0 else out
        want = {
            f"weight_ih_l{k}": (gates * hidden, layer_in),
            f"weight_hh_l{k}": (gates * hidden, out),
        }
        if bias:
            want[f"bias_ih_l{k}"] = (gates * hidden,)
            want[f"bias_hh_l{k}"] = (gates * hidden,)
        if proj:
            want[f"weight_hr_l{k}"] = (proj_size, hidden)
        for key, shape in want.items():
            t = params[key]
            if _shape(t) != shape:
                raise ValueError(
                    f"params[{key!r}]: expected shape {list(shape)} for {name} with hidden_size={hidden}, "
                    f"P={out}, input_size={input_size}; got {list(t.shape)}. Are these params of another "
                    f"cell kind or of a differently sized model?"
                )
            if t.dtype != dtype or t.device != device:
                raise ValueError(
                    f"params[{key!r}]: all params must share dtype and device; weight_hh_l0 is "
                    f"{dtype} on {device}, {key} is {t.dtype} on {t.device}. Convert with params.to(...)."
                )
    return Layout(cell, num_layers, input_size, hidden, proj_size, bias, dtype, device)
