"""``reference`` and the step functions against ``torch.nn.LSTM`` / ``torch.nn.GRU`` (no resets),
and the step functions' reset and shape rules."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import CELLS, flat, make_problem

import rnn_functional as rf


def _nn_module(cell: str, input_size: int, hidden: int, layers: int, bias: bool, proj: int) -> torch.nn.Module:
    if cell == "lstm":
        return torch.nn.LSTM(input_size, hidden, layers, bias=bias, batch_first=True, proj_size=proj).double()
    return torch.nn.GRU(input_size, hidden, layers, bias=bias, batch_first=True).double()


@pytest.mark.parametrize(
    "cell,layers,bias,proj",
    [("lstm", 1, True, 0), ("lstm", 2, False, 3), ("lstm", 2, True, 2), ("gru", 1, True, 0), ("gru", 2, False, 0)],
)
def test_reference_matches_torch_nn(cell: str, layers: int, bias: bool, proj: int) -> None:
    torch.manual_seed(0)
    module = _nn_module(cell, 4, 6, layers, bias, proj)
    params = rf.params_from_module(module)
    x = torch.randn(3, 7, 4, dtype=torch.float64, requires_grad=True)
    sizes = (proj or 6, 6) if cell == "lstm" else (6,)
    state = [torch.randn(3, layers, s, dtype=torch.float64, requires_grad=True) for s in sizes]
    hx = tuple(s.transpose(0, 1) for s in state) if cell == "lstm" else state[0].transpose(0, 1)
    y_nn, h_nn = module(x, hx)
    seq = CELLS[cell][2]
    y, h = seq(x, tuple(state) if cell == "lstm" else state[0], params, backend="reference")
    h_nn = tuple(s.transpose(0, 1) for s in flat(h_nn))
    torch.testing.assert_close(flat((y, h)), [y_nn, *h_nn])
    loss_nn = y_nn.pow(2).sum() + sum(s.sum() for s in h_nn)
    loss = y.pow(2).sum() + sum(s.sum() for s in flat(h))
    leaves = [x, *state, *module.parameters()]
    torch.testing.assert_close(torch.autograd.grad(loss, leaves), torch.autograd.grad(loss_nn, leaves))


def test_params_from_module_shares_storage() -> None:
    module = torch.nn.LSTM(3, 4, 2, proj_size=2)
    params = rf.params_from_module(module)
    assert set(params.keys()) == set(module.state_dict().keys())
    with torch.no_grad():
        module.weight_hh_l1.add_(1.0)
    assert params["weight_hh_l1"].data_ptr() == module.weight_hh_l1.data_ptr()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_init_matches_torch_nn_names_shapes_and_range(cell: str) -> None:
    init = CELLS[cell][0]
    kwargs = {"proj_size": 3} if cell == "lstm" else {}
    params = init(5, 8, 2, **kwargs)
    ref = (torch.nn.LSTM(5, 8, 2, proj_size=3) if cell == "lstm" else torch.nn.GRU(5, 8, 2)).state_dict()
    assert {k: tuple(v.shape) for k, v in params.items()} == {k: tuple(v.shape) for k, v in ref.items()}
    bound = 1 / 8**0.5
    for value in params.values():
        assert value.abs().max() <= bound
        assert value.std() > bound / 3  # uniform, not constant
    no_bias = init(5, 8, 1, bias=False)
    assert not any(k.startswith("bias") for k in no_bias.keys())
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    torch.testing.assert_close(init(5, 8, generator=g1), init(5, 8, generator=g2))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
def test_step_resets_to_zeros_and_matches_sequence(cell: str, batch_shape) -> None:
    """A step with is_init equals a step from zeros where set; T steps equal the sequence."""
    problem = make_problem(cell, batch_shape=batch_shape, time=4, layers=2, with_reset_state=False, reset_prob=0.4)
    step = CELLS[cell][1]
    state = problem["state"]
    ys = []
    for t in range(4):
        y, state = step(problem["x"][..., t, :], state, problem["params"], is_init=problem["is_init"][..., t])
        ys.append(y)
    y_seq, state_seq = CELLS[cell][2](
        problem["x"], problem["state"], problem["params"], is_init=problem["is_init"], backend="reference"
    )
    torch.testing.assert_close(flat((torch.stack(ys, -2), state)), flat((y_seq, state_seq)))


def test_step_accepts_trailing_singleton_is_init_and_none_state() -> None:
    params = rf.init_gru_params(3, 4, dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64)
    y1, h1 = rf.gru_step(x, None, params, is_init=torch.ones(5, 1, dtype=torch.bool))
    y2, h2 = rf.gru_step(x, torch.zeros(5, 1, 4, dtype=torch.float64), params)
    torch.testing.assert_close((y1, h1), (y2, h2))
    assert h1.shape == (5, 1, 4)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["auto", "pad"])
def test_step_backends_match_reference_step(cell: str, backend: str) -> None:
    """ATen's fused cells (eager ``pad``/``auto`` step) equal the reference step: outputs and grads."""
    problem = make_problem(cell, batch_shape=(2, 3), time=1, layers=2, with_reset_state=False, reset_prob=0.5)
    step = CELLS[cell][1]

    def run(name):
        out = step(problem["x"][..., 0, :], problem["state"], problem["params"], is_init=problem["is_init"][..., 0], backend=name)
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(flat(out)))
        return flat(out), torch.autograd.grad(loss, problem["leaves"], allow_unused=True, materialize_grads=True)

    torch.testing.assert_close(run(backend), run("reference"))


def test_step_unknown_backend() -> None:
    """The refusal lists the step backends serving the cell here: no 'parallel' for a GRU, 'triton' only where it
    runs (CI's TRITON_INTERPRET=1)."""
    params = rf.init_gru_params(3, 4)
    serving = ["auto", "reference", "pad"] + ["triton"] * ("triton" in rf.available_backends("cpu"))
    with pytest.raises(ValueError, match=re.escape(f"backend: expected one of {serving} for a GRU step here, got 'scan'")):
        rf.gru_step(torch.randn(2, 3), None, params, backend="scan")


@pytest.mark.parametrize("cell,backend", [("min_gru", "pad"), ("min_gru", "triton"), ("gru", "parallel")])
def test_step_backend_without_kernel_names_step_backends(cell, backend) -> None:
    """A step backend with no kernel for the cell names the step backends that serve it: never 'scan', which runs
    sequences only (the sequence functions' list named it)."""
    params = getattr(rf, f"init_{cell}_params")(3, 4)
    step = getattr(rf, f"{cell}_step")
    serving = [b for b in rf.available_backends("cpu", cell) if b != "scan"]
    with pytest.raises(ValueError, match=re.escape(f"backend {backend!r} cannot serve the") + ".*"
                       + re.escape(f"Use one of {serving} (or backend='auto'")):
        step(torch.randn(2, 3), None, params, backend=backend)
    sequence = getattr(rf, f"{cell}_sequence")
    with pytest.raises(ValueError, match=r"Use one of \[[^]]*'scan'"):
        sequence(torch.randn(2, 1, 3), None, params, backend=backend)  # the sequences' list: scan included
