"""Bad input gets a clear error naming the argument, the expectation and what was given."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import rnn_functional as rf

F, H, L, B, T = 4, 5, 2, 3, 6


@pytest.fixture
def lstm():
    params = rf.init_lstm_params(F, H, L)
    x = torch.randn(B, T, F)
    state = (torch.zeros(B, L, H), torch.zeros(B, L, H))
    return params, x, state


def expect(exc, *fragments):
    return pytest.raises(exc, match=".*".join(re.escape(f) for f in fragments))


def test_x_rank_and_features(lstm) -> None:
    params, x, state = lstm
    with expect(ValueError, "x: expected shape [*B, T, F] with F=4", "got [6]"):
        rf.lstm_sequence(torch.randn(T), None, params)
    with expect(ValueError, "x: expected shape [*B, T, F] with F=4", "got [3, 6, 7]"):
        rf.lstm_sequence(torch.randn(B, T, 7), None, params)
    with expect(ValueError, "x: expected shape [*B, F] with F=4", "got [3, 6]"):
        rf.lstm_step(torch.randn(B, 6), None, params)
    with expect(TypeError, "x: expected a tensor"):
        rf.lstm_step([1.0, 2.0], None, params)


def test_state_shapes_and_kind(lstm) -> None:
    params, x, _ = lstm
    with expect(ValueError, "state (c): expected shape [3, 2, 5]", "got [3, 1, 5]"):
        rf.lstm_sequence(x, (torch.zeros(B, L, H), torch.zeros(B, 1, H)), params)
    with expect(ValueError, "state (h): expected shape [3, 2, 5]", "got [2, 3, 5]"):
        rf.lstm_sequence(x, (torch.zeros(L, B, H), torch.zeros(B, L, H)), params)
    with expect(TypeError, "state: expected a tuple (h, c) of two tensors for LSTM", "got Tensor"):
        rf.lstm_sequence(x, torch.zeros(B, L, H), params)
    with expect(TypeError, "state: expected a tensor h for GRU", "got tuple"):
        rf.gru_sequence(x, (torch.zeros(B, L, H),), rf.init_gru_params(F, H, L))
    with expect(TypeError, "state: expected a tuple (h, c)", "got tuple of length 2 whose c is NoneType",
                "Pass state=None for zeros in every entry."):
        rf.lstm_sequence(x, (torch.zeros(B, L, H), None), params)
    with expect(TypeError, "reset_state: expected a tuple (h, c)", "got list of length 2 whose h is int, c is int."):
        rf.lstm_sequence(x, None, params, is_init=torch.zeros(B, T, dtype=torch.bool), reset_state=[0, 1])


def test_is_init_dtype_and_shape(lstm) -> None:
    params, x, state = lstm
    with expect(TypeError, "is_init: expected dtype torch.bool, got torch.int64", "is_init.bool()"):
        rf.lstm_sequence(x, state, params, is_init=torch.zeros(B, T, dtype=torch.long))
    with expect(ValueError, "is_init: expected shape [3, 6] or [3, 6, 1], got [3, 5]",
                "one bool per entry of x's leading dims"):
        rf.lstm_sequence(x, state, params, is_init=torch.zeros(B, T - 1, dtype=torch.bool))
    with expect(ValueError, "is_init: expected shape [3] or [3, 1], got [3, 6]"):
        rf.lstm_step(x[:, 0], state, params, is_init=torch.zeros(B, T, dtype=torch.bool))


def test_reset_state(lstm) -> None:
    params, x, state = lstm
    is_init = torch.zeros(B, T, dtype=torch.bool)
    good = (torch.zeros(B, T, L, H), torch.zeros(B, T, L, H))
    with expect(ValueError, "reset_state (h): expected shape [3, 6, 2, 5]", "got [3, 2, 5]"):
        rf.lstm_sequence(x, state, params, is_init=is_init, reset_state=(torch.zeros(B, L, H), good[1]))
    with expect(ValueError, "reset_state was given without is_init"):
        rf.lstm_sequence(x, state, params, reset_state=good)


def test_params_missing_extra_and_inconsistent() -> None:
    x = torch.randn(B, T, F)
    params = rf.init_lstm_params(F, H, L)
    with expect(KeyError, "missing key(s) ['bias_hh_l1']"):
        rf.lstm_sequence(x, None, params.exclude("bias_hh_l1"))
    with expect(KeyError, "missing key 'weight_ih_l0'"):
        rf.lstm_sequence(x, None, {})
    extra = params.clone()
    extra["weight_hr_l7"] = torch.zeros(1)
    with expect(KeyError, "unexpected key(s) ['weight_hr_l7']"):
        rf.lstm_sequence(x, None, extra)
    bad = params.clone()
    bad["weight_hh_l1"] = torch.zeros(4 * H, H + 1)
    with expect(ValueError, "params['weight_hh_l1']: expected shape [20, 5]", "got [20, 6]"):
        rf.lstm_sequence(x, None, bad)
    with expect(ValueError, "params['weight_hh_l0']: expected shape [4 * hidden_size, P] for LSTM", "another cell kind"):
        rf.lstm_sequence(x, None, rf.init_gru_params(F, 5, L))
    with expect(ValueError, "'weight_hr_l0' is an LSTM projection weight"):
        rf.gru_sequence(x, None, rf.init_lstm_params(F, H, L, proj_size=2))
    with expect(TypeError, "params must be a TensorDict"):
        rf.lstm_sequence(x, None, [1, 2])


def test_dtype_and_device_mismatch(lstm) -> None:
    params, x, state = lstm
    with expect(ValueError, "x: expected dtype torch.float32 on cpu", "got torch.float64 on cpu"):
        rf.lstm_sequence(x.double(), state, params)
    with expect(ValueError, "state (h): expected dtype torch.float32 on cpu", "got torch.float64"):
        rf.lstm_sequence(x, (state[0].double(), state[1]), params)
    with expect(ValueError, "x: expected dtype torch.float32 on cpu", "on meta"):
        rf.lstm_sequence(x.to("meta"), state, params)
    mixed = params.clone()
    mixed["bias_ih_l0"] = mixed["bias_ih_l0"].double()
    with expect(ValueError, "params['bias_ih_l0']: all params must share dtype and device"):
        rf.lstm_sequence(x, state, mixed)


def test_unknown_backend_and_options(lstm) -> None:
    params, x, state = lstm
    with expect(ValueError, "backend: expected one of ['auto', 'reference', 'scan', 'pad', 'triton'", "got 'cudnn'"):
        rf.lstm_sequence(x, state, params, backend="cudnn")
    with expect(ValueError, "dropout: expected a probability in [0, 1), got 1.5"):
        rf.lstm_sequence(x, state, params, dropout=1.5)
    with expect(ValueError, "recompute: expected one of ['none', 'full'], got 'some'"):
        rf.lstm_sequence(x, state, params, recompute="some")
    with expect(ValueError, "backend 'pad' cannot serve recompute='full'", "'reference', 'scan', 'triton'"):
        rf.lstm_sequence(x, state, params, backend="pad", recompute="full")


def _error_without_interpreter(call: str) -> str:
    """The ``ValueError`` message of ``call`` (``rf``/``torch`` code) in a fresh interpreter without
    ``TRITON_INTERPRET`` (CI sets it; the flag is read at import)."""
    code = f"import torch, rnn_functional as rf\ntry:\n    {call}\nexcept ValueError as e:\n    print(e)\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_triton_unavailable_says_so() -> None:
    """Without ``TRITON_INTERPRET`` a CPU call names the backends serving the cell here (no 'parallel' for an LSTM)."""
    out = _error_without_interpreter("rf.lstm_sequence(torch.randn(2, 3, 4), None, rf.init_lstm_params(4, 5), backend='triton')")
    assert "backend 'triton' is not available on cpu" in out
    assert "use one of ['reference', 'scan', 'pad']." in out


def test_init_params_arguments() -> None:
    with expect(ValueError, "proj_size must be 0 (no projection) or in [1, hidden_size=5), got 5"):
        rf.init_lstm_params(F, H, proj_size=5)
    with expect(ValueError, "input_size, hidden_size and num_layers must be positive", "num_layers=0"):
        rf.init_gru_params(F, H, 0)
    with expect(TypeError, "params_from_module(module): expected a torch.nn.LSTM or torch.nn.GRU",
                "got torch.nn.modules.linear.Linear."):
        rf.params_from_module(torch.nn.Linear(2, 2))
    with expect(TypeError, "got torch.nn.modules.rnn.RNN in mode 'RNN_TANH'"):
        rf.params_from_module(torch.nn.RNN(2, 2))
    with expect(ValueError, "bidirectional modules are not supported"):
        rf.params_from_module(torch.nn.GRU(2, 2, bidirectional=True))


def test_triton_step_unavailable_names_step_backends() -> None:
    """As above for a step function: its list holds no 'scan' (sequences only)."""
    out = _error_without_interpreter("rf.lstm_step(torch.randn(2, 4), None, rf.init_lstm_params(4, 5), backend='triton')")
    assert "backend 'triton' is not available on cpu" in out
    assert "use one of ['reference', 'pad']." in out
