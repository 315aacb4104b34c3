"""Empty batches, empty sequences and fresh outputs, on every backend.

- ``B=0`` and ``T=0`` (state given or ``None``): the outputs have the right shapes and stay
  connected to autograd, so a loss over an empty filtered minibatch backpropagates zeros
  into x, state and every param (as ``torch.nn.LSTM``/``GRU`` do at ``B=0``; they refuse ``T=0``).
- No output shares storage with an input (x, state, reset_state, params, is_init), and
  writing into an output leaves every input unchanged; ``T=0`` included.
"""

from __future__ import annotations

import pytest
import torch
from helpers import flat
from layout_helpers import assert_fresh_outputs, call, grad_leaves, input_tensors, make_values, with_layout
from torch import nn

import rnn_functional as rf

SEQUENCE_BACKENDS = [*rf.available_backends(cell="gru"), "auto"]
STEP_BACKENDS = [b for b in SEQUENCE_BACKENDS if b != "scan"]
CELLS = ["lstm", "gru"]
LAYERS, HIDDEN, INPUT = 2, 3, 2
# name -> (batch, time)
EMPTY_SEQUENCES = {"B0": (0, 3), "T0": (2, 0), "B0T0": (0, 0)}


def _problem(cell: str, mode: str, batch: int, time: int = 4) -> dict:
    """Fresh contiguous leaves (x, state, reset_state, params require grad) with a fixed ``is_init``."""
    values = make_values(cell, mode, batch=batch, time=time, input_size=INPUT, hidden=HIDDEN, layers=LAYERS)
    return with_layout(values, "contiguous", set())


def _check_empty_call(problem: dict, outs, state_given: bool, y_shape: tuple, time: int) -> None:
    """Shapes, values of the final state, and zero gradients (ones into a state passed straight through at T=0)."""
    y, final = outs[0], flat(outs[1])
    assert tuple(y.shape) == y_shape
    for s, s_in in zip(final, problem["state"]):
        assert s.shape == s_in.shape
        if time == 0:  # no step ran: the carry is the initial state, or zeros
            torch.testing.assert_close(s, s_in if state_given else torch.zeros_like(s_in))
    assert y.requires_grad, "y does not require grad: a loss over it cannot backpropagate"
    leaves = {"x": problem["x"], **problem["params"]}
    if state_given:
        leaves.update({f"state[{i}]": s for i, s in enumerate(problem["state"])})
    loss = y.sum() + sum(s.sum() for s in final)
    for name, leaf in leaves.items():
        (grad,) = torch.autograd.grad(loss, [leaf], retain_graph=True, allow_unused=True)
        assert grad is not None, f"{name} is not connected to the outputs: no gradient"
        passed_through = time == 0 and name.startswith("state")
        expected = torch.ones_like(leaf) if passed_through else torch.zeros_like(leaf)
        torch.testing.assert_close(grad, expected, msg=lambda m, name=name: f"gradient w.r.t. {name}: {m}")


@pytest.mark.parametrize("state_given", [True, False], ids=["state", "no_state"])
@pytest.mark.parametrize("shape", list(EMPTY_SEQUENCES), ids=list(EMPTY_SEQUENCES))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("backend", SEQUENCE_BACKENDS)
def test_empty_sequence_keeps_autograd(backend: str, cell: str, shape: str, state_given: bool) -> None:
    batch, time = EMPTY_SEQUENCES[shape]
    problem = _problem(cell, "sequence", batch, time)
    outs = call(problem, "sequence", backend, state_given=state_given)
    _check_empty_call(problem, outs, state_given, (batch, time, HIDDEN), time)
    if batch == 0 and time > 0 and state_given:  # torch.nn serves B=0 (not T=0): the same outputs and gradients
        _assert_equals_torch_nn(problem, outs)


def _assert_equals_torch_nn(problem: dict, outs) -> None:
    cell = problem["cell"]
    rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(INPUT, HIDDEN, LAYERS, batch_first=True, dtype=torch.float64)
    rnn.load_state_dict({k: p.detach() for k, p in problem["params"].items()})
    state_nn = [s.transpose(0, 1) for s in problem["state"]]  # [L, B, S]
    y_nn, final_nn = rnn(problem["x"], tuple(state_nn) if cell == "lstm" else state_nn[0])
    theirs = [y_nn, *(s.transpose(0, 1) for s in flat(final_nn))]
    ours = [outs[0], *flat(outs[1])]
    inputs = [problem["x"], *problem["state"]]
    g_ours = torch.autograd.grad(sum(t.sum() for t in ours), inputs + list(problem["params"].values()))
    g_theirs = torch.autograd.grad(sum(t.sum() for t in theirs), inputs + list(rnn.parameters()))
    torch.testing.assert_close(([o.detach() for o in ours], g_ours), ([t.detach() for t in theirs], g_theirs))


@pytest.mark.parametrize("state_given", [True, False], ids=["state", "no_state"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("backend", STEP_BACKENDS)
def test_empty_batch_step_keeps_autograd(backend: str, cell: str, state_given: bool) -> None:
    problem = _problem(cell, "step", 0)
    outs = call(problem, "step", backend, state_given=state_given)
    _check_empty_call(problem, outs, state_given, (0, HIDDEN), time=1)


# ----------------------------------------------------------------------------- aliasing

@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("interior", [True, False], ids=["interior_resets", "resets_at_t0"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("backend", SEQUENCE_BACKENDS)
def test_sequence_outputs_are_independent_of_each_other(backend: str, cell: str, interior: bool, layers: int) -> None:
    """Every output of a sequence call is a tensor of its own, as ``torch.nn.LSTM``'s ``output`` and ``h_n`` are: none
    shares memory with another, and none is computed from another, so a hook (or ``retain_grad``) on one output sees
    the gradient of its own uses only. A hook zeroing each output's gradient in turn leaves the gradients of a loss
    over the others unchanged, on every backend (``reference``, and ``pad`` without interior resets, returned the
    final carry that ``y`` and the segment states were computed from). The step functions document ``y`` as the top
    layer's ``h``, which the state holds too (``nn.LSTMCell``'s single ``h``)."""
    mode = "sequence"
    values = make_values(cell, mode, batch=3, input_size=INPUT, hidden=HIDDEN, layers=layers, interior_resets=interior)
    extra = {"return_segment_states": True}

    def outputs():
        problem = with_layout(values, "contiguous", set())
        return problem, flat(call(problem, mode, backend, **extra))

    _, outs = outputs()
    for i, a in enumerate(outs):
        for j in range(i):
            assert a.untyped_storage().data_ptr() != outs[j].untyped_storage().data_ptr(), \
                f"outputs {j} and {i} share memory"
    weights = [torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(k)) for k, o in enumerate(outs)]
    for hooked in range(len(outs)):
        grads = []
        for hook in (False, True):
            problem, outs = outputs()
            if hook:
                outs[hooked].register_hook(torch.zeros_like)
            loss = sum((o * w).sum() for k, (o, w) in enumerate(zip(outs, weights)) if k != hooked)
            grads.append(torch.autograd.grad(loss, grad_leaves(problem), allow_unused=True, materialize_grads=True))
        for k, (a, b) in enumerate(zip(*grads)):
            torch.testing.assert_close(a, b, msg=lambda m, k=k: f"a hook on output {hooked} changed gradient {k}: {m}")

ALIAS_CASES = {
    "sequence": ("sequence", {"batch": 3, "time": 4}),  # interior resets with reset_state
    "sequence-T0": ("sequence", {"batch": 2, "time": 0}),  # the final state must be a copy of the given state
    "step": ("step", {"batch": 3}),
}
# B=0 is left out: every output is empty, so there is no memory to share.


@pytest.mark.parametrize(
    ("backend", "cell", "case"),
    [
        pytest.param(backend, cell, case, id=f"{backend}-{cell}-{case}")
        for backend in SEQUENCE_BACKENDS
        for cell in CELLS
        for case, (mode, _) in ALIAS_CASES.items()
        if mode == "sequence" or backend in STEP_BACKENDS
    ],
)
def test_outputs_are_fresh(backend: str, cell: str, case: str) -> None:
    mode, sizes = ALIAS_CASES[case]
    problem = _problem(cell, mode, **sizes)
    extra = {"return_segment_states": True} if mode == "sequence" else {}
    outs = flat(call(problem, mode, backend, **extra))
    assert any(o.numel() for o in outs), "nothing to check: every output is empty"
    assert_fresh_outputs(outs, input_tensors(problem), f"{mode} on {backend!r}")
