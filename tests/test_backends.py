"""Every sequence backend against ``reference``: outputs and gradients w.r.t. x, state,
reset_state and every parameter. fp64 uses ``assert_close`` defaults; fp32 uses
rtol=1e-4, atol=1e-5: the backends sum the same terms in different orders (oneDNN's
fused GEMMs vs per-step matmuls), so they differ by a few ulps per step, compounding
over T steps of a contracting recurrence (~1e-6 observed at T=5..9)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_problem, outputs_and_grads, run_sequence

import rnn_functional as rf

BACKENDS = [b for b in rf.available_backends(cell="gru") if b not in ("reference", "triton")] + ["auto"]

# (cell, batch_shape, time, layers, bias, proj): together they cover L in {1, 2}, bias on/off,
# proj on/off, *B of 0, 1 and 2 dims, T = 1 and T > 1, for both cells.
CASES = [
    ("lstm", (3,), 6, 1, True, 0),
    ("lstm", (), 5, 2, True, 3),
    ("lstm", (2, 3), 1, 2, False, 0),
    ("lstm", (4,), 7, 2, False, 2),
    ("gru", (3,), 6, 1, True, 0),
    ("gru", (), 5, 2, False, 0),
    ("gru", (2, 3), 1, 1, True, 0),
    ("gru", (4,), 7, 2, True, 0),
]


def _case_id(case) -> str:
    cell, b, t, layers, bias, proj = case
    return f"{cell}-B{list(b)}-T{t}-L{layers}-{'bias' if bias else 'nobias'}-proj{proj}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("resets", ["reset_state", "zeros", "none"])
def test_backend_matches_reference_fp64(backend: str, case, resets: str) -> None:
    cell, batch_shape, time, layers, bias, proj = case
    problem = make_problem(
        cell, batch_shape=batch_shape, time=time, layers=layers, bias=bias, proj=proj,
        reset_prob=0.0 if resets == "none" else 0.35, with_reset_state=resets == "reset_state",
    )
    expected = outputs_and_grads(problem, "reference", return_segment_states=True)
    got = outputs_and_grads(problem, backend, return_segment_states=True)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_backend_matches_reference_fp32(backend: str, cell: str) -> None:
    problem = make_problem(cell, batch_shape=(5,), time=9, layers=2, dtype=torch.float32, hidden=16, input_size=8)
    expected = outputs_and_grads(problem, "reference")
    got = outputs_and_grads(problem, backend)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["pad", "scan", "auto"])
def test_all_rows_reset_everywhere(backend: str) -> None:
    """Every step a reset: the output depends only on the current input and reset state."""
    problem = make_problem("lstm", batch_shape=(3,), time=4, reset_prob=1.0)
    torch.testing.assert_close(outputs_and_grads(problem, backend), outputs_and_grads(problem, "reference"))


@pytest.mark.parametrize("backend", ["reference", "scan", "pad"])
def test_dropout_between_layers(backend: str) -> None:
    """Dropout changes the output only in training, only with L > 1, and keeps the shape."""
    problem = make_problem("gru", batch_shape=(8,), time=6, layers=2, requires_grad=False, hidden=32)
    y_eval, _ = run_sequence(problem, backend, dropout=0.5, training=False)
    y_ref, _ = run_sequence(problem, "reference")
    torch.testing.assert_close(y_eval, y_ref)
    torch.manual_seed(0)
    y_train, _ = run_sequence(problem, backend, dropout=0.5, training=True)
    assert y_train.shape == y_ref.shape
    assert not torch.allclose(y_train, y_ref)
    single = make_problem("gru", batch_shape=(8,), time=6, layers=1, requires_grad=False)
    torch.testing.assert_close(
        run_sequence(single, backend, dropout=0.5, training=True), run_sequence(single, "reference")
    )


def test_pad_without_interior_reset_is_one_kernel_call(monkeypatch) -> None:
    calls = []
    original = torch._VF.lstm

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch._VF, "lstm", counting)
    problem = make_problem("lstm", batch_shape=(4,), time=6, layers=2, reset_prob=0.0, requires_grad=False)
    is_init = torch.zeros(4, 6, dtype=torch.bool)
    is_init[:, 0] = True  # resets at t = 0 only are applied to the initial state
    problem["is_init"] = is_init
    y, _ = run_sequence(problem, "pad")
    assert len(calls) == 1
    torch.testing.assert_close(y, run_sequence(problem, "reference")[0])


def test_triton_availability_is_read_once_at_import(monkeypatch) -> None:
    """Whether ``triton`` can serve a call is decided without looking the package up again: torch 2.11's Dynamo
    cannot trace importlib's ``find_spec``, and every fullgraph compile of a CUDA call failed on it (H200 lease,
    docs/gpu.md)."""
    import importlib.util

    def refuse(name, *args, **kwargs):
        raise AssertionError(f"find_spec({name!r}) looked up during a call")

    monkeypatch.setattr(importlib.util, "find_spec", refuse)
    assert rf.available_backends("cpu") and rf.available_backends("cuda")
    params = rf.init_gru_params(4, 5)
    rf.gru_sequence(torch.randn(2, 3, 4), None, params)
    rf.gru_step(torch.randn(2, 4), None, params)
