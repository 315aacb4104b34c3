"""Compiled training through ``scan``'s hand-written backward with parameters that need no gradient and layers
whose inputs do: exact gradients, and the caller's tensors left as they were.

With Inductor's donated buffers (torch 2.13's default) these compiled backwards overwrote frozen parameters and
returned silently wrong gradients; ``rnn_functional`` turns them off on import (``backends/scan_parts.py``). Each
case is one the off-road sweeps found, compared with the eager ``reference`` call in float64 under the default
``torch.compile``; the first also checks the switch itself, so a torch upgrade that needs it no more shows here.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf


def _leaves_and_snapshot(params: dict, x: torch.Tensor):
    leaves = [t for t in (x, *params.values()) if t.requires_grad]
    return leaves, {k: v.detach().clone() for k, v in params.items()}


def _compare(loss, params: dict, x: torch.Tensor, backend: str, **kw):
    leaves, before = _leaves_and_snapshot(params, x)
    want = torch.autograd.grad(loss(x, params, "reference", **{**kw, "recompute": "none"}), leaves)
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss)(x, params, backend, **kw), leaves)
    for k, v in params.items():  # the compiled backward must not write into the caller's tensors
        torch.testing.assert_close(v.detach(), before[k], rtol=0, atol=0, msg=f"params[{k!r}] was overwritten")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_the_switch_is_off_after_import():
    assert torch._functorch.config.donated_buffer is False


@pytest.mark.parametrize("backend", ["auto"])
def test_projected_lstm_over_two_layers(backend):
    """A projected LSTM over two layers with stored states: the lower layer's gradients were off by 3x their size.
    Under compile ``auto``, ``scan`` and ``pad`` all run the ``scan`` layer (test_compile_functional.py checks that
    routing), so one compile of the default serves all three."""
    g = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in
              rf.init_lstm_params(3, 4, 2, proj_size=2, dtype=torch.float64, generator=g).items()}
    x = torch.randn(3, 6, 3, dtype=torch.float64, generator=g)
    is_init = torch.zeros(3, 6, dtype=torch.bool)
    is_init[0, 3] = True
    reset = (torch.randn(3, 6, 2, 2, dtype=torch.float64, generator=g),
             torch.randn(3, 6, 2, 4, dtype=torch.float64, generator=g))

    def loss(x, p, backend, recompute="none"):
        return rf.lstm_sequence(x, None, p, is_init=is_init, reset_state=reset, backend=backend)[0].pow(2).sum()

    _compare(loss, params, x, backend)


def test_frozen_norm_gru_over_two_layers():
    """Frozen params, only the input differentiated: the norm weights were overwritten, the input's gradient wrong."""
    g = torch.Generator().manual_seed(0)
    params = dict(rf.init_norm_gru_params(2, 16, 2, dtype=torch.float64, generator=g).items())
    x = torch.randn(1, 3, 2, dtype=torch.float64, generator=g).requires_grad_(True)
    is_init = torch.tensor([[False, True, False]])

    def loss(x, p, backend, recompute="none"):
        y, h = rf.norm_gru_sequence(x, None, p, is_init=is_init, backend=backend)
        return y.pow(2).sum() + h.pow(2).sum()

    _compare(loss, params, x, "auto")


def test_partly_frozen_min_gru_recomputed():
    """Some params frozen, ``recompute="full"``: a frozen bias was overwritten, a weight's gradient 0.1 off."""
    g = torch.Generator().manual_seed(787665)
    init = rf.init_min_gru_params(8, 6, 2, dtype=torch.float64, generator=g)
    params = {k: init[k].clone().requires_grad_(i % 2 == 0) for i, k in enumerate(init.keys())}
    x = torch.randn(1, 2, 8, dtype=torch.float64, generator=g).requires_grad_(True)
    state = torch.randn(1, 2, 6, dtype=torch.float64, generator=g)
    is_init = torch.tensor([[False, True]])

    def loss(x, p, backend, recompute):
        y, h = rf.min_gru_sequence(x, state, p, is_init=is_init, backend=backend, recompute=recompute)
        return y.pow(2).sum() + h.pow(2).sum()

    _compare(loss, params, x, "scan", recompute="full")
