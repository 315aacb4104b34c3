"""A projected LSTM over two layers trained under ``torch.compile``: exact gradients, or a clear refusal.

On torch 2.13 Inductor's donated buffers corrupt the lower layers' gradients of ``scan``'s compiled backward for
``proj_size > 0`` and ``num_layers >= 2`` with stored states (``reset_state``), silently: ``weight_hr_l0`` off by
3x its size. ``auto`` and ``pad`` run ``reference`` there, ``scan`` refuses; a step off that road (one layer, no
projection, no grad) keeps ``scan``. Compared with the eager ``reference`` call in float64.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf

B, T, F_IN, H, P, L = 3, 6, 3, 4, 2, 2


def _call(proj_size: int = P, num_layers: int = L):
    g = torch.Generator().manual_seed(0)
    params = rf.init_lstm_params(F_IN, H, num_layers, proj_size=proj_size, dtype=torch.float64, generator=g)
    params = {k: v.requires_grad_(True) for k, v in params.items()}
    x = torch.randn(B, T, F_IN, dtype=torch.float64, generator=g)
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[0, 3] = True
    reset = (torch.randn(B, T, num_layers, proj_size or H, dtype=torch.float64, generator=g),
             torch.randn(B, T, num_layers, H, dtype=torch.float64, generator=g))
    return x, params, is_init, reset


def _loss(x, params, is_init, reset, backend):
    return rf.lstm_sequence(x, None, params, is_init=is_init, reset_state=reset, backend=backend)[0].pow(2).sum()


@pytest.mark.parametrize("backend", ["auto", "pad"])
def test_projected_layers_train_exactly_when_compiled(backend):
    x, params, is_init, reset = _call()
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(_loss)(x, params, is_init, reset, backend), list(params.values()))
    want = torch.autograd.grad(_loss(x, params, is_init, reset, "reference"), list(params.values()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_scan_refuses_to_train_projected_layers_when_compiled():
    x, params, is_init, reset = _call()
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=r"backend 'scan' cannot train an LSTM with proj_size=2 over num_layers=2 "
                                         r"under torch.compile.*Use backend 'auto'"):
        torch.compile(_loss)(x, params, is_init, reset, "scan")


@pytest.mark.parametrize(("proj_size", "num_layers", "grad"), [(P, 1, True), (0, L, True), (P, L, False)])
def test_scan_still_serves_the_calls_next_to_it(proj_size, num_layers, grad):
    """One layer, no projection, or no gradient: ``scan`` is exact under compile and keeps serving the call."""
    x, params, is_init, reset = _call(proj_size, num_layers)
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        got = torch.compile(_loss)(x, params, is_init, reset, "scan")
    want = _loss(x, params, is_init, reset, "reference")
    torch.testing.assert_close(got, want)
    if grad:
        for a, b in zip(torch.autograd.grad(got, list(params.values())),
                        torch.autograd.grad(want, list(params.values()))):
            torch.testing.assert_close(a, b)
