"""Shared builders and graph/recompile counters for the torch.compile contract tests.

Compiler backends used by the tests:

* ``FAST`` = ``"aot_eager"``: Dynamo plus AOTAutograd (the joint forward/backward graph, the
  functionalization of the ``scan`` higher-order op) without Inductor's code generation. Graph
  breaks, host syncs, guards/recompiles and scan's autograd errors all happen at these stages,
  so it checks every compile contract at a fraction of Inductor's cost (an Inductor compile of a
  scan sequence takes 10-20 s on the CI's 2 cores).
* ``"inductor"`` (the default of ``torch.compile``) for a representative subset, in float32.

Tolerances: float64 results use ``torch.testing.assert_close`` defaults. Float32 results of
compiled code may differ from the eager ``reference`` loop in the last bits: ``scan`` projects
the whole input sequence in one GEMM where ``reference`` multiplies step by step, and Inductor
fuses and re-associates the gate arithmetic; over the few steps of these tests the differences
stay near float32 rounding (~1e-7 relative), so ``FP32_TOL`` (``rtol=1e-5, atol=1e-6``) leaves
a 10-100x margin while still catching any wrong reset or missing term (those are O(1e-1)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict
from torch._dynamo.utils import counters

from rnn_functional import (
    gru_sequence,
    gru_step,
    init_gru_params,
    init_lstm_params,
    lstm_sequence,
    lstm_step,
    norm_gru_sequence,
    norm_gru_step,
)

FAST = "aot_eager"
FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
F_IN, H = 3, 4  # input and hidden sizes of the test models; B, T in the tests never equal them

SEQUENCE = {"lstm": lstm_sequence, "gru": gru_sequence, "norm_gru": norm_gru_sequence}
STEP = {"lstm": lstm_step, "gru": gru_step, "norm_gru": norm_gru_step}

# (cell, num_layers, proj_size): one and two layers, with and without an LSTM projection
LAYOUTS = [("lstm", 1, 0), ("lstm", 2, 2), ("gru", 1, 0), ("gru", 2, 0)]


def layout_id(layout: tuple) -> str:
    cell, num_layers, proj = layout
    return f"{cell}-L{num_layers}" + (f"-proj{proj}" if proj else "")


def make_params(cell: str, num_layers: int, proj: int, dtype: torch.dtype, seed: int = 0) -> TensorDict:
    """Params of a small model, every leaf requiring grad."""
    g = torch.Generator().manual_seed(seed)
    if cell == "lstm":
        params = init_lstm_params(F_IN, H, num_layers, proj_size=proj, dtype=dtype, generator=g)
    else:
        params = init_gru_params(F_IN, H, num_layers, dtype=dtype, generator=g)
    return params.apply(lambda t: t.detach().requires_grad_())


def state_widths(cell: str, proj: int) -> tuple[int, ...]:
    return (proj or H, H) if cell == "lstm" else (H,)


def as_state(cell: str, parts: tuple[torch.Tensor, ...]):
    """The public state form: ``(h, c)`` for LSTM, ``h`` for GRU."""
    return tuple(parts) if cell == "lstm" else parts[0]


def as_parts(cell: str, state) -> tuple[torch.Tensor, ...]:
    return tuple(state) if cell == "lstm" else (state,)


def reset_mask(batch: int, time: int, seed: int = 0, p: float = 0.3) -> torch.Tensor:
    """``[B, T]`` bool: resets at ``t = 0`` on the first row and random interior resets."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, time, generator=g) < p
    mask[0, 0] = True
    if time > 2:
        mask[-1, time // 2] = True
    return mask


@dataclass
class SequenceCase:
    """Inputs of one sequence call; every float tensor requires grad."""

    cell: str
    x: torch.Tensor
    state: tuple[torch.Tensor, ...]
    is_init: torch.Tensor | None
    reset_state: tuple[torch.Tensor, ...] | None
    weights: torch.Tensor  # [B, T, P], weights of y in the loss
    leaves: list[torch.Tensor] = field(default_factory=list)


def make_sequence_case(
    cell: str, num_layers: int, proj: int, resets: str, dtype: torch.dtype, batch: int = 2, time: int = 5, seed: int = 0
) -> SequenceCase:
    """``resets``: ``"none"`` (no is_init), ``"zeros"`` (is_init only) or ``"state"`` (is_init + reset_state)."""
    g = torch.Generator().manual_seed(seed + 1)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    widths = state_widths(cell, proj)
    x = rand(batch, time, F_IN)
    state = tuple(rand(batch, num_layers, w) for w in widths)
    is_init = None if resets == "none" else reset_mask(batch, time, seed)
    reset_state = tuple(rand(batch, time, num_layers, w) for w in widths) if resets == "state" else None
    weights = torch.randn(batch, time, widths[0], generator=g, dtype=dtype)
    leaves = [x, *state, *(reset_state or ())]
    return SequenceCase(cell, x, state, is_init, reset_state, weights, leaves)


def sequence_loss_fn(cell: str, backend: str, **options) -> Callable:
    """``fn(x, state parts, params, is_init, reset parts, weights) -> (loss, y, *state_T)``.

    ``options`` go to the sequence function (e.g. ``recompute="full"``).

    The loss reads ``y`` and both final states with weight one each, so the final ``h`` and
    ``c`` of an LSTM receive cotangents that are views of one tensor (the pattern that broke
    scan's compiled backward, see ``backends/scan.py``).
    """
    seq = SEQUENCE[cell]

    def fn(x, state, params, is_init, reset_state, weights):
        rs = None if reset_state is None else as_state(cell, reset_state)
        y, final = seq(x, as_state(cell, state), params, is_init=is_init, reset_state=rs, backend=backend, **options)
        parts = as_parts(cell, final)
        loss = (y * weights).sum() + sum(p.sum() for p in parts)
        return (loss, y, *parts)

    return fn


def run_with_grads(fn: Callable, case: SequenceCase, params: TensorDict) -> tuple[tuple, tuple]:
    """Outputs of ``fn`` on ``case`` and the grads of its loss wrt inputs and params."""
    out = fn(case.x, case.state, params, case.is_init, case.reset_state, case.weights)
    leaves = [*case.leaves, *params.values()]
    grads = torch.autograd.grad(out[0], leaves)
    return tuple(t.detach() for t in out), grads


@dataclass
class GraphStats:
    graphs: int = 0  # graphs compiled since entering (first compiles + recompiles)
    breaks: int = 0  # graph breaks recorded since entering


@contextmanager
def compile_stats() -> Iterator[GraphStats]:
    """Count graphs compiled and graph breaks recorded inside the block (Dynamo's counters)."""
    graphs0 = counters["stats"]["unique_graphs"]
    breaks0 = sum(counters["graph_break"].values())
    stats = GraphStats()
    try:
        yield stats
    finally:
        stats.graphs = counters["stats"]["unique_graphs"] - graphs0
        stats.breaks = sum(counters["graph_break"].values()) - breaks0


# ----------------------------------------------------------------------------- policies

POLICY_MODES = ["step", "batch", "ragged"]  # sequential mode, recurrent [B, T], recurrent flat [N]


def make_policy(cell: str, backend: str = "auto", lib: str = "ours", num_layers: int = 1, device=None):
    """``TensorDictSequential(rnn module, MLP head, argmax action)`` over keys obs -> feat -> logits -> action.

    ``lib``: ``"ours"`` (rnn_functional's module) or ``"torchrl"`` (torchrl.modules', for comparison).
    """
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import MLP

    if lib == "ours":
        import rnn_functional as mods
    else:
        import torchrl.modules as mods
    module_cls = mods.LSTMModule if cell == "lstm" else mods.GRUModule
    torch.manual_seed(0)
    rnn = module_cls(input_size=F_IN, hidden_size=H, num_layers=num_layers, in_key="obs", out_key="feat",
                     recurrent_backend=backend, device=device)
    head = TensorDictModule(MLP(in_features=H, out_features=2, num_cells=[8], device=device),
                            in_keys=["feat"], out_keys=["logits"])
    act = TensorDictModule(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return TensorDictSequential(rnn, head, act)


def hidden_keys(cell: str) -> list[str]:
    return ["recurrent_state_h", "recurrent_state_c"] if cell == "lstm" else ["recurrent_state"]


def policy_input(cell: str, mode: str, batch: int = 3, time: int = 5, num_layers: int = 1, seed: int = 0,
                 is_init: torch.Tensor | None = None, device=None) -> TensorDict:
    """An input TensorDict for ``mode``: ``step`` ``[B]``, ``batch`` ``[B, T]``, ``ragged`` ``[N = B * T]``.

    Hidden states are random (stored states to restart from); ``is_init`` defaults to
    :func:`reset_mask` (flattened for ``ragged``).
    """
    g = torch.Generator().manual_seed(seed)
    shape = {"step": (batch,), "batch": (batch, time), "ragged": (batch * time,)}[mode]
    if is_init is None:
        if mode == "step":
            is_init = torch.tensor([i % 2 == 0 for i in range(batch)])
        else:
            is_init = reset_mask(batch, time, seed).reshape(shape)
    data = {"obs": torch.randn(*shape, F_IN, generator=g), "is_init": is_init.reshape(*shape, 1)}
    for key in hidden_keys(cell):
        data[key] = torch.randn(*shape, num_layers, H, generator=g)
    return TensorDict(data, batch_size=shape).to(device) if device is not None else TensorDict(data, batch_size=shape)


def policy_loss(out: TensorDict, cell: str) -> torch.Tensor:
    """Log-probability of the chosen action plus the next hidden states (every output gets a cotangent)."""
    logp = torch.log_softmax(out["logits"], -1).gather(-1, out["action"].unsqueeze(-1))
    return -logp.mean() + sum(out["next", k].mean() for k in hidden_keys(cell))


def call_policy(policy, td: TensorDict, mode: str) -> TensorDict:
    """Run ``policy`` on a copy of ``td`` in the recurrent mode ``mode`` needs."""
    from rnn_functional import set_recurrent_mode

    with set_recurrent_mode(mode != "step"):
        return policy(td.clone())
