"""The LSTM cell (``torch.nn.LSTM``'s equations, optional output projection ``proj_size``), and the parameter layout
of ``torch.nn.LSTM`` it shares with the GRU cell (:class:`TorchRNNCell`): layer ``k`` (``G`` gates, ``P = proj_size or
H``, ``F_0`` the input size, ``F_k = P``) has ``weight_ih_l{k} [G*H, F_k]``, ``weight_hh_l{k} [G*H, P]``, with ``bias``
``bias_ih_l{k}``/``bias_hh_l{k} [G*H]``, with ``proj_size`` (LSTM) ``weight_hr_l{k} [P, H]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from .base import (AtenKernels, Carry, Cell, LayerWeights, Layout, Saved, StepGrads, TritonKernels, check_keys,
                   check_shapes, check_sizes, count_layers, register, uniform_)

__all__ = ["LSTM", "TorchRNNCell", "init_lstm_params"]

_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
# layer k's keys formatted once (every call reads them); a plain tuple, which Dynamo reads as a constant
_NAMES = tuple(tuple(f"{kind}_l{k}" for kind in _KINDS) for k in range(16))
_EXPECTED: dict[tuple, tuple[frozenset[str], tuple[tuple[str, tuple[int, ...]], ...]]] = {}


def _names(k: int) -> tuple[str, ...]:
    """Layer ``k``'s keys: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``, ``weight_hr``."""
    return _NAMES[k] if k < len(_NAMES) else tuple(f"{kind}_l{k}" for kind in _KINDS)


def _expected(signature: tuple) -> tuple[frozenset[str], tuple[tuple[str, tuple[int, ...]], ...]]:
    """Every key of params with this layout ``(num_gates, num_layers, bias, proj_size, hidden, input_size)``, and each
    key with its shape; kept for the next call (eagerly: Dynamo would trace the store)."""
    num_gates, num_layers, bias, proj_size, hidden, input_size = signature
    out, gates = proj_size or hidden, num_gates * hidden
    want: list[tuple[str, tuple[int, ...]]] = []
    for k in range(num_layers):
        ih, hh, bih, bhh, hr = _names(k)
        want += [(ih, (gates, input_size if k == 0 else out)), (hh, (gates, out))]
        if bias:
            want += [(bih, (gates,)), (bhh, (gates,))]
        if proj_size:
            want.append((hr, (proj_size, hidden)))
    found = (frozenset(key for key, _ in want), tuple(want))
    if not torch.compiler.is_compiling():
        _EXPECTED[signature] = found
    return found


class TorchRNNCell(Cell):
    """A cell with ``torch.nn.LSTM``'s parameter names and layout (the LSTM and GRU cells): ``num_gates`` blocks of
    ``H`` rows per weight, ``weight_hr_l{k}`` where ``projection``."""

    projection: bool = False

    def init_params(self, input_size: int, hidden_size: int, num_layers: int, bias: bool, proj_size: int,
                    dtype: torch.dtype | None, device, generator: torch.Generator | None) -> TensorDict:
        """Params with ``torch.nn`` names, uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` like ``torch.nn.LSTM``."""
        check_sizes(input_size, hidden_size, num_layers)
        if proj_size < 0 or (proj_size and proj_size >= hidden_size):
            raise ValueError(f"proj_size must be 0 (no projection) or in [1, hidden_size={hidden_size}), got {proj_size}.")
        out_size, gates = proj_size or hidden_size, self.num_gates * hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        tensors: dict[str, torch.Tensor] = {}
        for k in range(num_layers):
            tensors[f"weight_ih_l{k}"] = uniform_((gates, input_size if k == 0 else out_size), bound, dtype, device,
                                                  generator)
            tensors[f"weight_hh_l{k}"] = uniform_((gates, out_size), bound, dtype, device, generator)
            if bias:
                tensors[f"bias_ih_l{k}"] = uniform_((gates,), bound, dtype, device, generator)
                tensors[f"bias_hh_l{k}"] = uniform_((gates,), bound, dtype, device, generator)
            if proj_size:
                tensors[f"weight_hr_l{k}"] = uniform_((proj_size, hidden_size), bound, dtype, device, generator)
        return TensorDict(tensors, batch_size=[], device=device)

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        keys, num_layers = params.keys(), 0
        while (_NAMES[num_layers][0] if num_layers < 16 else f"weight_ih_l{num_layers}") in keys:
            num_layers += 1
        if not num_layers:
            count_layers(keys, "weight_ih_l{k}", self)  # raises, naming the missing key
        bias, proj = "bias_ih_l0" in keys, "weight_hr_l0" in keys
        if proj and not self.projection:
            raise ValueError(f"params: 'weight_hr_l0' is an LSTM projection weight; {self.title} has no proj_size.")
        w_hh0 = params["weight_hh_l0"]
        if w_hh0.ndim != 2 or w_hh0.shape[0] % self.num_gates:
            raise ValueError(f"params['weight_hh_l0']: expected shape [{self.num_gates} * hidden_size, P] for "
                             f"{self.title}, got {tuple(w_hh0.shape)}. Are these params of another cell kind?")
        hidden = w_hh0.shape[0] // self.num_gates
        proj_size = params["weight_hr_l0"].shape[0] if proj else 0
        input_size = params["weight_ih_l0"].shape[-1]
        signature = (self.num_gates, num_layers, bias, proj_size, hidden, input_size)
        # traced, no table read: a guard on a missing key recompiles once an eager call stores it
        compiling = torch.compiler.is_compiling()
        expected, want = _expected(signature) if compiling else _EXPECTED.get(signature) or _expected(signature)
        if keys != expected:  # one comparison in C for a dict's keys; other mappings take the detailed check
            check_keys(set(keys), expected, f"a {num_layers}-layer {self.title} (bias={bias}, proj={proj})")
        dtype, device = w_hh0.dtype, w_hh0.device
        for key, shape in want:
            t = params[key]
            if t.shape != shape or t.dtype != dtype or t.device != device:  # raises, naming the key and both values
                check_shapes(params, dict(want), f"{self.title} with hidden_size={hidden}, P={proj_size or hidden}, "
                             f"input_size={input_size}", "weight_hh_l0")
        state_sizes = (proj_size or hidden, hidden) if len(self.state_names) == 2 else (hidden,)
        return Layout(self, num_layers, input_size, hidden, state_sizes, dtype, device, bias, proj_size)

    def layout_of(self, params: Mapping[str, torch.Tensor], known: Layout | None) -> Layout:
        weight, w_in = params.get("weight_hh_l0"), params.get("weight_ih_l0")
        if (known is None or weight is None or w_in is None or weight.dtype != known.dtype
                or weight.device != known.device or w_in.shape[-1] != known.input_size
                or weight.shape[-1] != known.state_sizes[0] or weight.shape[0] != self.num_gates * known.hidden_size
                or f"weight_hh_l{known.num_layers - 1}" not in params or f"weight_hh_l{known.num_layers}" in params):
            return self.read_layout(params)
        return known

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        """Weights of layer ``k``; ``extra`` is ``(weight_hr,)`` for a cell with ``projection``, else empty."""
        ih, hh, bih, bhh, hr = _NAMES[k] if k < 16 else _names(k)
        bias = layout.bias
        extra = (params[hr] if layout.proj_size else None,) if self.projection else ()
        return LayerWeights(params[ih], params[bih] if bias else None, params[hh], params[bhh] if bias else None, extra)

    def flat_weights(self, params: Mapping[str, torch.Tensor], layout: Layout) -> list[torch.Tensor]:
        """All weights in ``torch.nn.LSTM``'s ``_flat_weights`` order, as ATen's kernels take them."""
        flat = []
        for k in range(layout.num_layers):
            w = self.layer_weights(params, layout, k)
            flat += [w.weight_ih, w.weight_hh]
            if layout.bias:
                flat += [w.bias_ih, w.bias_hh]
            flat += [t for t in w.extra if t is not None]
        return flat


def init_lstm_params(
    input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool = True, proj_size: int = 0,
    dtype: torch.dtype | None = None, device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """LSTM parameters initialised like ``torch.nn.LSTM`` (uniform in ``[-1/sqrt(H), 1/sqrt(H)]``). Keys for layer
    ``k``: ``weight_ih_l{k} [4H, F_k]``, ``weight_hh_l{k} [4H, P]``, ``bias_ih_l{k}``/``bias_hh_l{k} [4H]`` (with
    ``bias``), ``weight_hr_l{k} [P, H]`` (``proj_size``); ``P = proj_size or H``, ``F_0 = input_size``, ``F_k = P``.
    """
    return LSTM.init_params(input_size, hidden_size, num_layers, bias, proj_size, dtype, device, generator)


def _aten_sequence(layout: Layout, params, inputs, hx: Carry, dropout: float, training: bool, batch_sizes):
    args = (LSTM.flat_weights(params, layout), layout.bias, layout.num_layers, dropout, training, False)
    if batch_sizes is None:
        out = torch._VF.lstm(inputs, hx, *args, True)
    else:
        out = torch._VF.lstm(inputs, batch_sizes, hx, *args)
    return out[0], tuple(out[1:])


def _aten_step(w: LayerWeights, x: torch.Tensor, carry: Carry) -> Carry:
    return tuple(torch._VF.lstm_cell(x, carry, w.weight_ih, w.weight_hh, w.bias_ih, w.bias_hh))


class LSTMCell(TorchRNNCell):
    """``torch.nn.LSTM``: carry ``(h [N, P], c [N, H])``, gates ``i, f, g, o``."""

    name = "lstm"
    title = "LSTM"
    state_names = ("h", "c")
    state_doc = "``(h [*B, L, P], c [*B, L, H])``"
    params_doc = "torch.nn.LSTM state-dict keys (weight_ih_l0, weight_hh_l0, ...)"
    init_function = "init_lstm_params"
    out_dim = "P"
    aten = AtenKernels(sequence=_aten_sequence, step=_aten_step, fused_on_cpu=True)
    triton = TritonKernels(is_lstm=True)
    num_gates = 4
    projection = True

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights) -> tuple[Carry, Saved]:
        """``gi [N, 4H]``, carry ``(h [N, P], c [N, H])`` -> ``((h', c'), (i, f, g, o))``, the activated gates
        ``[N, H]`` (``tanh(c')`` is recomputed by the backward's elementwise pass); ``extra = (weight_hr,)``."""
        h, c = carry
        i, f, g, o = (gi + F.linear(h, w.weight_hh, w.bias_hh)).chunk(4, dim=-1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c_next = torch.addcmul(i * g, f, c)  # c' = f * c + i * g: the backward recomputes it by the same op
        h_next = o * torch.tanh(c_next)
        (weight_hr,) = w.extra
        if weight_hr is not None:
            h_next = F.linear(h_next, weight_hr)
        return (h_next, c_next), (i, f, g, o)

    def carry_rest_given_h(self, gi: torch.Tensor, h_prev: torch.Tensor, rest0: Carry, w: LayerWeights) -> Carry:
        """``(c [R, T, H],)``: every step's gates at once (they read ``h``, not ``c``), then ``c``'s recurrence."""
        (_, candidate), (_, f, *_) = self.layer_step_saving(gi, (h_prev, torch.zeros_like(h_prev[..., :1])), w)
        c, cs = rest0[0], []  # candidate: i * g
        for f_t, candidate_t in zip(f.unbind(1), candidate.unbind(1)):  # not [:, t]: see backends/reference.py
            c = torch.addcmul(candidate_t, f_t, c)
            cs.append(c)
        return (torch.stack(cs, dim=1),)

    def backward_factors(self, saved: Saved, carry: Carry, w: LayerWeights) -> Saved:
        """``(k [.., 4H], a [.., H], f [.., H])`` (and ``o * tanh(c')`` with ``weight_hr``): the gate
        cotangents are ``cat([dc, dc, dc, dh]) * k``, and ``dc = dc' + dh * a``."""
        (i, f, g, o), c = saved, carry[1]
        tanh_c = torch.tanh(torch.addcmul(i * g, f, c))  # tanh(c'), as the forward computed it
        k = torch.cat([g * i * (1 - i), c * f * (1 - f), i * (1 - g * g), tanh_c * o * (1 - o)], dim=-1)
        projected = () if w.extra[0] is None else (o * tanh_c,)
        return (k, o * (1 - tanh_c * tanh_c), f, *projected)

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        """``d_gh`` equals ``d_gi`` (gates sum both projections); ``d_extra = (d_weight_hr [P, H] | None,)``."""
        (k, a, f, *unprojected), (dh_new, dc_new) = factors, d_new
        (weight_hr,) = w.extra
        d_hr = None
        if weight_hr is not None:
            d_hr = dh_new.transpose(0, 1) @ unprojected[0]
            dh_new = dh_new @ weight_hr
        dc = torch.addcmul(dc_new, dh_new, a)
        d_gates = torch.cat([dc, dc, dc, dh_new], dim=-1) * k
        return StepGrads((d_gates @ w.weight_hh, dc * f), d_gates, None, (d_hr,))


LSTM = register(LSTMCell())
