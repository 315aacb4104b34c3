"""RG-LRU (De et al. 2024, Griffin/Hawk): the real-gated linear recurrent unit.

Per layer: ``u, r, i = split(x_t @ weight^T + bias, 3)``, ``r = sigmoid(r)``, ``i = sigmoid(i)``,
``log_a = -c * r * softplus(-Λ)`` (``a = sigmoid(Λ)^(c r)`` in log space, ``c = 8``), and
``h_t = a * h_{t-1} + sqrt(1 - a^2) * (i * u)``. ``sqrt(1 - a^2)`` is computed as
``sqrt(-expm1(2 log_a))``: exact where ``a`` is close to 1, where ``1 - a * a`` cancels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from ._linear_rnn import LinearRecurrentCell, init_linear_params
from .base import Carry, LayerWeights, Saved, StepGrads

__all__ = ["RGLRU", "init_rglru_params"]

C = 8  # the gate's exponent scale (Griffin's c); an int: under torch.compile(dynamic=True) Dynamo makes a float global a
# graph input, which a scan body fails to lift ("lift_tracked_freevar_to_input should not be called on root SubgraphTracer")


def _parts(gi: torch.Tensor, log_lambda: torch.Tensor):
    """``(u, r, i, log_a, a, m = sqrt(1 - a^2))`` from ``gi [..., 3H]``.

    Where ``a`` rounds to 1 (a saturated gate, ``r = 0``; or ``softplus(-Λ)`` underflowing), ``m = 0`` and sqrt's
    derivative there is infinite, while the true gradient of every input is 0 (``dm/dr ~ 1/sqrt(r)`` times ``r``'s
    own factor ``r (1 - r)``): autograd's inf * 0 made every gradient NaN. ``m`` is taken through ``where`` on both
    sides, so its derivatives there are 0, to every order."""
    u, r, i = gi.chunk(3, dim=-1)
    r, i = torch.sigmoid(r), torch.sigmoid(i)
    log_a = -C * r * F.softplus(-log_lambda)
    v = -torch.expm1(2 * log_a)
    pos = v > 0
    return u, r, i, log_a, torch.exp(log_a), torch.where(pos, torch.sqrt(torch.where(pos, v, 1.0)), 0.0)


class RGLRUCell(LinearRecurrentCell):
    """RG-LRU: ``weight_l{k} [3H, F_k]``, ``bias_l{k} [3H]`` (rows: input, recurrence gate, input gate) and
    ``log_lambda_l{k} [H]`` (``Λ``)."""

    name = "rglru"
    title = "RG-LRU"
    gates = 3
    extra_keys = ("log_lambda_l{k}",)
    params_doc = "keys weight_l{k} [3H, F_k], bias_l{k} [3H], log_lambda_l{k} [H] per layer k"
    init_function = "init_rglru_params"

    def coefficients(self, gi: torch.Tensor, w: LayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        u, _, i, _, a, m = _parts(gi, w.extra[0])
        return a, m * i * u

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        (gi,), (h,), (g,) = factors, carry, d_new
        log_lambda = w.extra[0]
        u, r, i, _, a, m = _parts(gi, log_lambda)
        d_m = g * i * u
        # d log_a: through a (a h, da/dlog_a = a) and through m (dm/dlog_a = -a^2 / m)
        pos = m > 0  # 1/m where m = 0 enters as 0 (the limit, see _parts)
        d_log_a = a * (g * h - d_m * a * torch.where(pos, torch.where(pos, m, 1.0).reciprocal(), 0.0))
        d_r = d_log_a * (-C * F.softplus(-log_lambda)) * r * (1 - r)
        d_i = g * m * u * i * (1 - i)
        d_lambda = (d_log_a * (C * r) * torch.sigmoid(-log_lambda)).sum(0)  # d softplus(-Λ)/dΛ = -sigmoid(-Λ)
        return StepGrads((g * a,), torch.cat([g * m * i, d_r, d_i], dim=-1), None, (d_lambda,))


RGLRU = RGLRUCell()


def _init_log_lambda(hidden_size: int, dtype, device, generator) -> torch.Tensor:
    """``Λ`` with ``sigmoid(Λ)^c`` uniform in ``[0.9, 0.999]`` (Griffin's initialisation)."""
    decay = torch.empty(hidden_size, dtype=torch.float64, device=device).uniform_(0.9, 0.999, generator=generator)
    return torch.logit(decay ** (1.0 / C)).to(dtype or torch.get_default_dtype())


def init_rglru_params(
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> TensorDict:
    """RG-LRU params: ``weight_l{k} [3H, F_k]`` and ``bias_l{k} [3H]`` initialised like ``torch.nn.Linear`` (uniform in
    ``[-1/sqrt(F_k), 1/sqrt(F_k)]``), ``log_lambda_l{k} [H]`` so that ``sigmoid(Λ)^8`` is uniform in ``[0.9, 0.999]``."""
    return init_linear_params(RGLRU, input_size, hidden_size, num_layers, dtype, device, generator, _init_log_lambda)
