"""RG-LRU (De et al. 2024, Griffin/Hawk), one registered cell per ``segment_start`` (equations, ``segment_start`` and
recurrentgemma's variant: docs/linear_recurrences.md)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from ._linear_rnn import LinearRecurrentCell, init_linear_params
from .base import Carry, LayerWeights, Saved, StepGrads, register

__all__ = ["RGLRU", "RGLRU_RECURRENTGEMMA", "SEGMENT_STARTS", "init_rglru_params", "rglru_cell",
           "rglru_params_from_recurrentgemma"]

C = 8  # the gate's exponent scale (Griffin's c); an int: under torch.compile(dynamic=True) Dynamo makes a float global a
# graph input, which a scan body fails to lift ("lift_tracked_freevar_to_input should not be called on root SubgraphTracer")


def _parts(gi: torch.Tensor, log_lambda: torch.Tensor):
    """``(u, r, i, a, m = sqrt(1 - a^2))`` from ``gi [..., 3H]``; ``m = sqrt(-expm1(2 log_a))``, exact near
    ``a = 1``. Where ``a`` rounds to 1, sqrt's derivative is infinite but every true gradient is 0 (autograd's inf * 0
    gave NaN): ``m`` goes through ``where`` on both sides, so its derivatives there are 0, to every order."""
    u, r, i = gi.chunk(3, dim=-1)
    r, i = torch.sigmoid(r), torch.sigmoid(i)
    log_a = -C * r * F.softplus(-log_lambda)
    v = -torch.expm1(2 * log_a)
    pos = v > 0
    return u, r, i, torch.exp(log_a), torch.where(pos, torch.sqrt(torch.where(pos, v, 1.0)), 0.0)


class RGLRUCell(LinearRecurrentCell):
    """RG-LRU: ``weight_l{k} [3H, F_k]``, ``bias_l{k} [3H]`` (rows: input, recurrence gate, input gate) and
    ``log_lambda_l{k} [H]`` (``Λ``). ``segment_start``: see the module docstring."""

    name = "rglru"
    title = "RG-LRU"
    gates = 3
    extra_keys = ("log_lambda_l{k}",)
    params_doc = "keys weight_l{k} [3H, F_k], bias_l{k} [3H], log_lambda_l{k} [H] per layer k"
    init_function = "init_rglru_params"

    def __init__(self, segment_start: str = "scaled") -> None:
        self.segment_start = segment_start
        if segment_start != "scaled":
            self.name, self.title = f"rglru_{segment_start}", f"RG-LRU (segment_start={segment_start!r})"
            self.reads_starts = True

    def __reduce__(self):  # copies and pickles are the registered cell (the compiled ensemble op finds it by name)
        return rglru_cell, (self.segment_start,)

    def coefficients(self, gi: torch.Tensor, w: LayerWeights,
                     *start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, _, i, a, m = _parts(gi, w.extra[0])
        if start:  # recurrentgemma: a segment's first step takes the gated input unscaled
            m = torch.where(start[0], 1.0, m)
        return a, m * i * u

    def step_backward_saved(self, factors: Saved, carry: Carry, w: LayerWeights, d_new: Carry) -> StepGrads:
        (gi, *start), (h,), (g,) = factors, carry, d_new
        log_lambda = w.extra[0]
        u, r, i, a, m = _parts(gi, log_lambda)
        d_m = g * i * u
        pos = m > 0  # 1/m where m = 0 enters as 0 (the limit, see _parts)
        inv_m = torch.where(pos, torch.where(pos, m, 1.0).reciprocal(), 0.0)
        if start:  # m = 1 at a segment's first step: no longer a function of a
            m, inv_m = torch.where(start[0], 1.0, m), torch.where(start[0], 0.0, inv_m)
        # d log_a: through a (a h, da/dlog_a = a) and through m (dm/dlog_a = -a^2 / m)
        d_log_a = a * (g * h - d_m * a * inv_m)
        d_r = d_log_a * (-C * F.softplus(-log_lambda)) * r * (1 - r)
        d_i = g * m * u * i * (1 - i)
        d_lambda = (d_log_a * (C * r) * torch.sigmoid(-log_lambda)).sum(0)  # d softplus(-Λ)/dΛ = -sigmoid(-Λ)
        return StepGrads((g * a,), torch.cat([g * m * i, d_r, d_i], dim=-1), None, (d_lambda,))


RGLRU = register(RGLRUCell())
RGLRU_RECURRENTGEMMA = register(RGLRUCell("recurrentgemma"))
SEGMENT_STARTS = {"scaled": RGLRU, "recurrentgemma": RGLRU_RECURRENTGEMMA}


def rglru_cell(segment_start: str) -> RGLRUCell:
    """The registered cell for ``segment_start`` (``ValueError`` naming the allowed values otherwise)."""
    if not isinstance(segment_start, str) or segment_start not in SEGMENT_STARTS:
        raise ValueError(f"segment_start: expected one of {list(SEGMENT_STARTS)}, got {segment_start!r}.")
    return SEGMENT_STARTS[segment_start]


# init -> (low, high, p): Λ with sigmoid(Λ)^p uniform in [low, high] (recurrentgemma's rnn_param_init: p = 2)
_INITS = {"griffin": (0.9, 0.999, C), "recurrentgemma": (0.9 ** 2 + 1e-8, 0.999 ** 2 + 1e-8, 2)}


def init_rglru_params(input_size: int, hidden_size: int, num_layers: int = 1, *, init: str = "griffin",
                      dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                      generator: torch.Generator | None = None) -> TensorDict:
    """RG-LRU params: ``weight_l{k} [3H, F_k]`` and ``bias_l{k} [3H]`` initialised like ``torch.nn.Linear`` (uniform in
    ``[-1/sqrt(F_k), 1/sqrt(F_k)]``), ``log_lambda_l{k} [H]`` by ``init``: ``"griffin"`` puts ``sigmoid(Λ)^8`` (the
    decay at ``r = 1``) uniform in ``[0.9, 0.999]``; ``"recurrentgemma"`` puts ``sigmoid(Λ)`` in ``[0.9, 0.999]``
    as DeepMind's code does (uniform on the ring's area; the decay at ``r = 1`` then lies in ``[0.43, 0.992]``)."""
    if init not in _INITS:
        raise ValueError(f"init: expected one of {sorted(_INITS)}, got {init!r}.")
    low, high, p = _INITS[init]

    def log_lambda(hidden_size: int, dtype, device, generator) -> torch.Tensor:  # drawn in fp64
        power = torch.empty(hidden_size, dtype=torch.float64, device=device).uniform_(low, high, generator=generator)
        return torch.logit(power ** (1.0 / p)).to(dtype or torch.get_default_dtype())

    return init_linear_params(RGLRU, input_size, hidden_size, num_layers, dtype, device, generator, log_lambda)


def rglru_params_from_recurrentgemma(layer: Mapping[str, torch.Tensor] | torch.nn.Module) -> TensorDict:
    """One-layer RG-LRU params from recurrentgemma's torch ``RGLRU`` (the module or its state dict: ``a_param``,
    ``input_gate.w/.b``, ``a_gate.w/.b``), sharing nothing: an identity input projection, the gates' blocks on the
    diagonal of ``weight_l0``, ``Λ = -a_param``. For its segment starts pass ``segment_start="recurrentgemma"`` to
    ``rglru_step``/``rglru_sequence``/``RGLRUModule``; see docs/linear_recurrences.md."""
    tensors = layer.state_dict() if isinstance(layer, torch.nn.Module) else layer
    a_param = tensors["a_param"].detach()
    gates = ("a_gate", "input_gate")  # y = x @ blockdiag(w) + b: F.linear's [out, in] weight is blockdiag(w)^T
    weight = torch.cat([torch.eye(a_param.shape[-1], dtype=a_param.dtype, device=a_param.device),
                        *(torch.block_diag(*tensors[f"{key}.w"].detach()).T for key in gates)])
    bias = torch.cat([torch.zeros_like(a_param), *(tensors[f"{key}.b"].detach().flatten() for key in gates)])
    return TensorDict({"weight_l0": weight, "bias_l0": bias, "log_lambda_l0": -a_param.clone()}, batch_size=[],
                      device=a_param.device)
