"""What the cells linear in their state share (:mod:`.min_gru`, :mod:`.rglru`): no recurrent matmul, ``(a_t, b_t)``
from ``gi_t = x_t @ weight_l{k}^T + bias_l{k}`` and the ``extra_keys`` weights alone (what ``parallel`` solves)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from .base import Carry, Cell, LayerWeights, Layout, Saved, check_shapes, check_sizes, count_layers, uniform_


def init_linear_params(cell: LinearRecurrentCell, input_size: int, hidden_size: int, num_layers: int, dtype, device,
                       generator, extra_init) -> TensorDict:
    """``weight_l{k}``/``bias_l{k}`` initialised like ``torch.nn.Linear`` (uniform in ``[-1/sqrt(F_k), 1/sqrt(F_k)]``)
    and each of ``cell.extra_keys`` by ``extra_init(hidden_size, dtype, device, generator)``."""
    check_sizes(input_size, hidden_size, num_layers)
    tensors: dict[str, torch.Tensor] = {}
    for k in range(num_layers):
        fan_in = input_size if k == 0 else hidden_size
        bound = 1.0 / math.sqrt(fan_in)
        tensors[f"weight_l{k}"] = uniform_((cell.gates * hidden_size, fan_in), bound, dtype, device, generator)
        tensors[f"bias_l{k}"] = uniform_((cell.gates * hidden_size,), bound, dtype, device, generator)
        for key in cell.extra_keys:
            tensors[key.format(k=k)] = extra_init(hidden_size, dtype, device, generator)
    return TensorDict(tensors, batch_size=[], device=device)


class LinearRecurrentCell(Cell):
    """A cell with ``h_t = a_t * h_{t-1} + b_t``, ``(a_t, b_t) = coefficients(gi_t)``; carry ``(h [N, H],)``."""

    linear_in_state = True
    gates: int  # G: the projection's blocks
    extra_keys: tuple[str, ...] = ()  # per-layer [H] params beside weight/bias, e.g. "log_lambda_l{k}"

    def read_layout(self, params: Mapping[str, torch.Tensor]) -> Layout:
        num_layers = count_layers(set(params.keys()), ("weight_l{k}", "bias_l{k}", *self.extra_keys), self)
        weight = params["weight_l0"]
        if weight.ndim != 2 or weight.shape[0] % self.gates or weight.shape[0] == 0:
            raise ValueError(f"params['weight_l0']: expected shape [{self.gates}*H, F] ({self.title}: {self.gates} "
                             f"blocks of H rows), got {list(weight.shape)}.")
        hidden, input_size = weight.shape[0] // self.gates, weight.shape[1]
        want = {}
        for k in range(num_layers):
            want[f"weight_l{k}"] = (self.gates * hidden, input_size if k == 0 else hidden)
            want[f"bias_l{k}"] = (self.gates * hidden,)
            want.update({key.format(k=k): (hidden,) for key in self.extra_keys})
        check_shapes(params, want, f"input_size={input_size}, hidden_size={hidden}, num_layers={num_layers}", "weight_l0")
        return Layout(self, num_layers, input_size, hidden, (hidden,), weight.dtype, weight.device, bias=True)

    def layer_weights(self, params: Mapping[str, torch.Tensor], layout: Layout, k: int) -> LayerWeights:
        """No recurrent weight: ``weight_hh``/``bias_hh`` are ``None``; ``extra`` holds the ``extra_keys``."""
        return LayerWeights(params[f"weight_l{k}"], params[f"bias_l{k}"], None, None,
                            extra=tuple(params[key.format(k=k)] for key in self.extra_keys))

    def coefficients(self, gi: torch.Tensor, w: LayerWeights,
                     *start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)``, each ``[..., H]``, from ``gi [..., G*H]`` (any leading dims; ``start``: see ``reads_starts``)."""
        raise NotImplementedError

    def layer_step_saving(self, gi: torch.Tensor, carry: Carry, w: LayerWeights,
                          *start: torch.Tensor) -> tuple[Carry, Saved]:
        """``h' = a * h + b``; saves ``gi`` and ``start``, from which the backward recomputes ``a``, ``b``."""
        a, b = self.coefficients(gi, w, *start)
        return (torch.addcmul(b, a, carry[0]),), (gi, *start)
