"""Shared builders for the tests: random params, states and reset patterns."""

from __future__ import annotations

import sys
import types

import torch

import rnn_functional as rf

CELLS = {
    "lstm": (rf.init_lstm_params, rf.lstm_step, rf.lstm_sequence),
    "gru": (rf.init_gru_params, rf.gru_step, rf.gru_sequence),
}


def state_sizes(cell: str, hidden: int, proj: int) -> tuple[int, ...]:
    return (proj or hidden, hidden) if cell == "lstm" else (hidden,)


def pack_state(cell: str, tensors: list[torch.Tensor]):
    """The public state format: ``(h, c)`` for LSTM, ``h`` for GRU."""
    return tuple(tensors) if cell == "lstm" else tensors[0]


def make_problem(
    cell: str,
    *,
    batch_shape: tuple[int, ...] = (3,),
    time: int = 5,
    input_size: int = 4,
    hidden: int = 5,
    layers: int = 1,
    bias: bool = True,
    proj: int = 0,
    reset_prob: float = 0.3,
    with_reset_state: bool = True,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    requires_grad: bool = True,
) -> dict:
    """Random params, ``x``, initial state, ``is_init`` and ``reset_state`` for one sequence call."""
    g = torch.Generator().manual_seed(seed)
    init = CELLS[cell][0]
    kwargs = {"proj_size": proj} if cell == "lstm" else {}
    params = init(input_size, hidden, layers, bias=bias, dtype=dtype, generator=g, **kwargs)
    sizes = state_sizes(cell, hidden, proj)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    x = randn(*batch_shape, time, input_size)
    state = [randn(*batch_shape, layers, s) for s in sizes]
    is_init = torch.rand(*batch_shape, time, generator=g) < reset_prob if reset_prob > 0 else None
    reset = [randn(*batch_shape, time, layers, s) for s in sizes] if (with_reset_state and is_init is not None) else None
    leaves = [x, *state, *(reset or []), *params.values()]
    if requires_grad:
        for t in leaves:
            t.requires_grad_(True)
    return {
        "cell": cell,
        "params": params,
        "x": x,
        "state": pack_state(cell, state),
        "is_init": is_init,
        "reset_state": None if reset is None else pack_state(cell, reset),
        "leaves": leaves,
    }


def run_sequence(problem: dict, backend: str, **kwargs):
    seq = CELLS[problem["cell"]][2]
    return seq(
        problem["x"],
        problem["state"],
        problem["params"],
        is_init=problem["is_init"],
        reset_state=problem["reset_state"],
        backend=backend,
        **kwargs,
    )


def flat(out) -> list[torch.Tensor]:
    """All tensors of a (nested tuple) output, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]


def outputs_and_grads(problem: dict, backend: str, **kwargs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs of a sequence call and the gradients of a loss over all of them w.r.t. every leaf."""
    outs = flat(run_sequence(problem, backend, **kwargs))
    g = torch.Generator().manual_seed(123)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, problem["leaves"], allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], list(grads)


def exec_as_module(code: str, filename: str, name: str) -> dict:
    """Run a docs page's ``code`` as the body of a module ``name`` registered in ``sys.modules`` (torch 2.11's
    Dynamo imports the module its traced code's globals name, and fails on a bare ``exec`` namespace); returns the
    module's namespace."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, filename, "exec"), module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module.__dict__
