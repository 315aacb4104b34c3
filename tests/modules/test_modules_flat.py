"""Our modules in recurrent mode on a flat ``[N]`` SliceSampler-like batch: re-batched == reference (fp64)."""

from __future__ import annotations

import pytest
import torch
from module_helpers import HIDDEN_KEYS, make_module, state_widths, weighted_sum
from tensordict import TensorDict

import rnn_functional as rf


@pytest.mark.parametrize("backend", ["auto", "pad"])
@pytest.mark.parametrize("cell,layers", [("lstm", 1), ("lstm", 2), ("gru", 1), ("gru", 2)])
def test_module_on_flat_slice_batch(cell, layers, backend):
    """A flat [N] TensorDict of slices in recurrent mode: re-batched module == reference module,
    outputs, next states and gradients of x, stored states and parameters."""
    n, hk = 30, HIDDEN_KEYS[cell]
    g = torch.Generator().manual_seed(3)
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[[0, 4, 5, 13, 20, 29]] = True
    data = {"x": torch.randn(n, 4, generator=g, dtype=torch.float64), "is_init": is_init}
    for k, w in zip(hk, state_widths(cell, 5, 0)):
        data[k] = torch.randn(n, layers, w, generator=g, dtype=torch.float64)
    results = []
    for name in (backend, "reference"):
        module = make_module(cell, layers=layers, recurrent_backend=name)
        td = TensorDict({k: v.clone().requires_grad_(v.is_floating_point()) for k, v in data.items()}, [n])
        with rf.set_recurrent_mode(True):
            out = module(td)
        outs = [out["y"], *(out["next", k] for k in hk)]
        leaves = [td["x"], *(td[k] for k in hk), *module.parameters()]
        results.append((outs, torch.autograd.grad(weighted_sum(outs), leaves)))
    (outs, grads), (want_outs, want_grads) = results
    for a, b in zip([*outs, *grads], [*want_outs, *want_grads]):
        torch.testing.assert_close(a, b)
