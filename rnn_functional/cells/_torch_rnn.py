"""The parameter layout of ``torch.nn.LSTM`` / ``torch.nn.GRU``, shared by the LSTM and GRU cells: layer ``k``
(``G`` gates, ``P = proj_size or H``, ``F_0`` the input size, ``F_k = P``) has ``weight_ih_l{k} [G*H, F_k]``,
``weight_hh_l{k} [G*H, P]``, with ``bias`` ``bias_ih_l{k}``/``bias_hh_l{k} [G*H]``, with ``proj_size`` (LSTM)
``weight_hr_l{k} [P, H]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from .base import Cell, LayerWeights, Layout, check_keys, check_shapes, check_sizes, count_layers, uniform_


def init_params(
    num_gates: int, input_size: int, hidden_size: int, num_layers: int, bias: bool, proj_size: int,
    dtype: torch.dtype | None, device, generator: torch.Generator | None,
) -> TensorDict:
    """Params with ``torch.nn`` names, uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` like ``torch.nn.LSTM``."""
    check_sizes(input_size, hidden_size, num_layers)
    if proj_size < 0 or (proj_size and proj_size >= hidden_size):
        raise ValueError(f"proj_size must be 0 (no projection) or in [1, hidden_size={hidden_size}), got {proj_size}.")
    out_size = proj_size or hidden_size
    bound = 1.0 / math.sqrt(hidden_size)
    tensors: dict[str, torch.Tensor] = {}
    for k in range(num_layers):
        layer_in = input_size if k == 0 else out_size
        tensors[f"weight_ih_l{k}"] = uniform_((num_gates * hidden_size, layer_in), bound, dtype, device, generator)
        tensors[f"weight_hh_l{k}"] = uniform_((num_gates * hidden_size, out_size), bound, dtype, device, generator)
        if bias:
            tensors[f"bias_ih_l{k}"] = uniform_((num_gates * hidden_size,), bound, dtype, device, generator)
            tensors[f"bias_hh_l{k}"] = uniform_((num_gates * hidden_size,), bound, dtype, device, generator)
        if proj_size:
            tensors[f"weight_hr_l{k}"] = uniform_((proj_size, hidden_size), bound, dtype, device, generator)
    return TensorDict(tensors, batch_size=[], device=device)


_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
# layer k's keys formatted once (every call reads them); a plain tuple, which Dynamo reads as a constant
_NAMES = tuple(tuple(f"{kind}_l{k}" for kind in _KINDS) for k in range(16))


def _names(k: int) -> tuple[str, ...]:
    """Layer ``k``'s keys: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``, ``weight_hr``."""
    return _NAMES[k] if k < len(_NAMES) else tuple(f"{kind}_l{k}" for kind in _KINDS)


def _once(fn):
    """``fn`` memoised for eager calls; a traced call runs it (Dynamo warns on a functools cache)."""
    cached = functools.lru_cache(maxsize=256)(fn)
    return lambda *args: fn(*args) if torch.compiler.is_compiling() else cached(*args)


@_once
def _keys(num_layers: int, bias: bool, proj: bool) -> frozenset[str]:
    """Every key of params with this layout."""
    kept = (True, True, bias, bias, proj)
    return frozenset(key for k in range(num_layers) for key, keep in zip(_names(k), kept) if keep)


@_once
def _shapes(num_gates: int, num_layers: int, bias: bool, proj_size: int, hidden: int,
            input_size: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each key of params with this layout, and its shape."""
    out, gates = proj_size or hidden, num_gates * hidden
    want: list[tuple[str, tuple[int, ...]]] = []
    for k in range(num_layers):
        ih, hh, bih, bhh, hr = _names(k)
        want += [(ih, (gates, input_size if k == 0 else out)), (hh, (gates, out))]
        if bias:
            want += [(bih, (gates,)), (bhh, (gates,))]
        if proj_size:
            want.append((hr, (proj_size, hidden)))
    return tuple(want)


def read_layout(cell: Cell, params: Mapping[str, torch.Tensor], num_gates: int, projection: bool) -> Layout:
    """Validate ``torch.nn``-named params of ``cell`` (``projection``: whether ``weight_hr`` may appear)."""
    keys = params.keys()
    num_layers = count_layers(keys, "weight_ih_l{k}", cell)
    bias = "bias_ih_l0" in keys
    proj = "weight_hr_l0" in keys
    if proj and not projection:
        raise ValueError(f"params: 'weight_hr_l0' is an LSTM projection weight; {cell.title} has no proj_size.")
    expected = _keys(num_layers, bias, proj)
    if keys != expected:  # one comparison in C for a dict's keys; other mappings take the detailed check
        check_keys(set(keys), expected, f"a {num_layers}-layer {cell.title} (bias={bias}, proj={proj})")

    w_hh0 = params["weight_hh_l0"]
    if w_hh0.ndim != 2 or w_hh0.shape[0] % num_gates:
        raise ValueError(f"params['weight_hh_l0']: expected shape [{num_gates} * hidden_size, P] for {cell.title}, "
                         f"got {tuple(w_hh0.shape)}. Are these params of another cell kind?")
    hidden = w_hh0.shape[0] // num_gates
    proj_size = params["weight_hr_l0"].shape[0] if proj else 0
    out = proj_size or hidden
    input_size = params["weight_ih_l0"].shape[-1]
    want = _shapes(num_gates, num_layers, bias, proj_size, hidden, input_size)
    dtype, device = w_hh0.dtype, w_hh0.device
    if any(params[k].shape != s or params[k].dtype != dtype or params[k].device != device for k, s in want):
        check_shapes(params, dict(want), f"{cell.title} with hidden_size={hidden}, P={out}, input_size={input_size}",
                     "weight_hh_l0")  # raises, naming the key, the expected and the actual
    state_sizes = (out, hidden) if len(cell.state_names) == 2 else (hidden,)
    return Layout(cell, num_layers, input_size, hidden, state_sizes, dtype, device, bias, proj_size)


def layer_weights(params: Mapping[str, torch.Tensor], layout: Layout, k: int, projection: bool) -> LayerWeights:
    """Weights of layer ``k``; ``extra`` is ``(weight_hr,)`` for a cell with ``projection``, else empty."""
    ih, hh, bih, bhh, hr = _names(k)
    bias = layout.bias
    extra = (params[hr] if layout.proj_size else None,) if projection else ()
    return LayerWeights(params[ih], params[bih] if bias else None, params[hh], params[bhh] if bias else None, extra)


def flat_weights(cell: Cell, params: Mapping[str, torch.Tensor], layout: Layout) -> list[torch.Tensor]:
    """All weights in ``torch.nn.LSTM``'s ``_flat_weights`` order, as ATen's kernels take them."""
    flat = []
    for k in range(layout.num_layers):
        w = cell.layer_weights(params, layout, k)
        flat += [w.weight_ih, w.weight_hh]
        if layout.bias:
            flat += [w.bias_ih, w.bias_hh]
        flat += [t for t in w.extra if t is not None]
    return flat
