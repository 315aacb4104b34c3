"""``proj_size`` is exact everywhere it is accepted (TorchRL's Python LSTM ignores ``weight_hr``).

Against ``torch.nn.LSTM(proj_size=...)`` (ATen kernels, an independent implementation) and
against ``reference``: outputs and gradients in float64 with ``assert_close`` defaults, over
several steps so that the projected ``h`` (width ``P``, not ``H``) is fed back.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rnn_functional import gru_sequence, init_gru_params, init_lstm_params, lstm_sequence, lstm_step, params_from_module

F64 = torch.float64
B, T, F, H, P = 3, 6, 4, 7, 3


def _nn_lstm(layers: int, bias: bool = True) -> nn.LSTM:
    torch.manual_seed(0)
    return nn.LSTM(F, H, layers, bias=bias, proj_size=P, batch_first=True, dtype=F64)


def _inputs(layers: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, F, dtype=F64, generator=g, requires_grad=True)
    h0 = torch.randn(B, layers, P, dtype=F64, generator=g, requires_grad=True)
    c0 = torch.randn(B, layers, H, dtype=F64, generator=g, requires_grad=True)
    return x, h0, c0


def _grads(outputs, leaves):
    g = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, dtype=o.dtype, generator=g)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("layers,bias", [(1, True), (2, True), (2, False)])
@pytest.mark.parametrize("backend", ["reference", "scan", "pad"])
def test_sequence_matches_torch_nn(backend, layers, bias):
    """No resets: one ``torch.nn.LSTM`` call is the oracle for y, (h_T, c_T) and all gradients."""
    lstm = _nn_lstm(layers, bias)
    params = params_from_module(lstm)
    x, h0, c0 = _inputs(layers)
    leaves = [x, h0, c0, *lstm.parameters()]
    y_nn, (h_nn, c_nn) = lstm(x, (h0.transpose(0, 1), c0.transpose(0, 1)))
    out_nn = [y_nn, h_nn.transpose(0, 1), c_nn.transpose(0, 1)]
    y, (h, c) = lstm_sequence(x, (h0, c0), params, backend=backend)
    assert y.shape == (B, T, P) and h.shape == (B, layers, P) and c.shape == (B, layers, H)
    for a, b in zip([y, h, c], out_nn):
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads([y, h, c], leaves), _grads(out_nn, leaves)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["scan", "pad"])
def test_sequence_with_resets_matches_reference(backend):
    """Interior resets to stored (projected) states: outputs, final state and every gradient."""
    g = torch.Generator().manual_seed(2)
    params = init_lstm_params(F, H, 2, proj_size=P, dtype=F64, generator=g).requires_grad_(True)
    x, h0, c0 = _inputs(2, seed=3)
    is_init = torch.rand(B, T, generator=g) < 0.35
    is_init[0, 2] = True
    reset = (torch.randn(B, T, 2, P, dtype=F64, generator=g, requires_grad=True),
             torch.randn(B, T, 2, H, dtype=F64, generator=g, requires_grad=True))
    leaves = [x, h0, c0, *reset, *params.values()]
    results = {}
    for name in ("reference", backend):
        y, (h, c) = lstm_sequence(x, (h0, c0), params, is_init=is_init, reset_state=reset, backend=name)
        results[name] = ([y, h, c], _grads([y, h, c], leaves))
    for a, b in zip(results[backend][0] + list(results[backend][1]),
                    results["reference"][0] + list(results["reference"][1])):
        torch.testing.assert_close(a, b)


def test_step_fed_back_matches_torch_nn():
    """``lstm_step`` called T times, its projected state fed back, equals one nn.LSTM call."""
    lstm = _nn_lstm(2)
    params = params_from_module(lstm)
    x, h0, c0 = _inputs(2)
    leaves = [x, h0, c0, *lstm.parameters()]
    y_nn, (h_nn, c_nn) = lstm(x, (h0.transpose(0, 1), c0.transpose(0, 1)))
    state, ys = (h0, c0), []
    for t in range(T):
        y_t, state = lstm_step(x[:, t], state, params)
        assert y_t.shape == (B, P) and state[0].shape == (B, 2, P) and state[1].shape == (B, 2, H)
        ys.append(y_t)
    ours = [torch.stack(ys, 1), *state]
    theirs = [y_nn, h_nn.transpose(0, 1), c_nn.transpose(0, 1)]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads(ours, leaves), _grads(theirs, leaves)):
        torch.testing.assert_close(a, b)


def test_state_of_width_h_is_rejected_with_projection():
    """A state of width H instead of P (TorchRL's Python LSTM's mistake) is a clear error."""
    params = init_lstm_params(F, H, 1, proj_size=P, dtype=F64)
    x = torch.randn(B, T, F, dtype=F64)
    bad = (torch.zeros(B, 1, H, dtype=F64), torch.zeros(B, 1, H, dtype=F64))
    with pytest.raises(ValueError, match=rf"state \(h\): expected shape \[{B}, 1, {P}\]"):
        lstm_sequence(x, bad, params)


def test_projection_rejected_where_meaningless():
    with pytest.raises(ValueError, match="proj_size must be 0 .* or in \\[1, hidden_size"):
        init_lstm_params(F, H, 1, proj_size=H)
    gru = init_gru_params(F, H, 1, dtype=F64)
    gru["weight_hr_l0"] = torch.zeros(P, H, dtype=F64)
    with pytest.raises(ValueError, match="GRU has no proj_size"):
        gru_sequence(torch.zeros(B, T, F, dtype=F64), None, gru)
