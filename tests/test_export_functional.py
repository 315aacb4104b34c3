"""``torch.export`` of the functional sequence API called on tensors the exported module closes over.

A model-based or scripted user keeps params, an initial state and ``reset_state`` as plain tensors (a TensorDict
from ``init_*_params``, not registered on a module) and exports a ``forward`` that calls ``*_sequence`` on them.
The exported graph holds such tensors as constants; torch's ``scan`` failed to trace a step that read one under
non-strict export ("Cannot access data pointer of Tensor"). Each backend that serves the cell, strict and not,
with resets inside the sequence; the exported program must equal the eager call on other inputs and resets.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf

B, T, F, H = 3, 5, 4, 6
CELLS = {
    "gru": (rf.init_gru_params, rf.gru_sequence, ("reference", "scan", "pad", "auto")),
    "lstm": (rf.init_lstm_params, rf.lstm_sequence, ("scan", "auto")),
    "block_gru": (lambda f, h: rf.init_block_gru_params(f, h, projection_size=4, num_blocks=2),
                  rf.block_gru_sequence, ("scan", "auto")),
    "min_gru": (rf.init_min_gru_params, rf.min_gru_sequence, ("parallel", "scan")),
}
# strict export on the scan paths (where the failure was), non-strict on every backend
CASES = [(cell, backend, strict) for cell, (_, _, backends) in CELLS.items() for backend in backends
         for strict in (False, True) if not strict or backend in ("scan", "auto")]


def _state(cell: str, lead: tuple):
    shape = (*lead, 1, H)
    return (torch.randn(shape), torch.randn(shape)) if cell == "lstm" else torch.randn(shape)


@pytest.mark.parametrize("cell,backend,strict", CASES)
def test_export_reads_closed_over_params_and_states(cell: str, backend: str, strict: bool) -> None:
    init, sequence = CELLS[cell][:2]
    torch.manual_seed(0)
    params, state0, reset = init(F, H), _state(cell, (B,)), _state(cell, (B, T))

    class Forward(torch.nn.Module):
        def forward(self, x, is_init):
            return sequence(x, state0, params, is_init=is_init, reset_state=reset, backend=backend)

    def is_init_with(*steps):
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[1, list(steps)] = True
        return mask

    x = torch.randn(B, T, F)
    program = torch.export.export(Forward(), (x, is_init_with(0, 2)), strict=strict).module()
    for x_new, mask in ((x, is_init_with(0, 2)), (torch.randn(B, T, F), is_init_with(3))):
        torch.testing.assert_close(program(x_new, mask), Forward()(x_new, mask), rtol=1e-5, atol=1e-6)
