"""``torch.export`` of whole sequences: the functional API on closed-over tensors, the modules in recurrent mode with
a dynamic time dim.

A model-based or scripted user keeps params, an initial state and ``reset_state`` as plain tensors (a TensorDict
from ``init_*_params``, not registered on a module) and exports a ``forward`` that calls ``*_sequence`` on them.
The exported graph holds such tensors as constants; torch's ``scan`` failed to trace a step that read one under
non-strict export ("Cannot access data pointer of Tensor"). Each backend that serves the cell, strict and not,
with resets inside the sequence; the exported program must equal the eager call on other inputs and resets.

A recurrent-mode module exported with ``Dim("T", min=2)`` refused ``T = 2``: the segment ends of its stored-hidden
outputs were a ``pad``, whose traced decomposition guards ``T - 1 != 1``.
"""

from __future__ import annotations

import pytest
import torch

from tensordict import TensorDict

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


# the segment ends that broke are the module's, for any cell: each cell once, each kind of export once
@pytest.mark.parametrize(("cell", "strict"), [("lstm", True), ("gru", False)], ids=["lstm-strict", "gru-non_strict"])
def test_export_module_in_recurrent_mode_with_dynamic_time(cell: str, strict: bool) -> None:
    torch.manual_seed(0)
    keys = ["h", "c"] if cell == "lstm" else ["h"]
    cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    module = cls(input_size=F, hidden_size=H, num_layers=2, in_keys=["x", *keys],
                 out_keys=["y", *(("next", k) for k in keys)], default_recurrent_mode=True)

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, x, is_init, *hidden):
            td = TensorDict({"x": x, "is_init": is_init, **dict(zip(keys, hidden))}, batch_size=is_init.shape[:2])
            out = self.module(td)
            return out["y"], *(out["next", k] for k in keys)

    def inputs(b: int, t: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        is_init = torch.rand(b, t, 1, generator=g) < 0.3
        is_init[:, 0] = True
        is_init[0, t // 2] = True
        return (torch.randn(b, t, F, generator=g), is_init, *(torch.randn(b, t, 2, H, generator=g) for _ in keys))

    batch, time = torch.export.Dim("B", min=2, max=64), torch.export.Dim("T", min=2, max=64)
    both = {0: batch, 1: time}
    dims = {"x": both, "is_init": both, "hidden": tuple(both for _ in keys)}
    policy, traced = Policy(), inputs(3, 5, 0)
    before = policy(*traced)
    program = torch.export.export(policy, traced, dynamic_shapes=dims, strict=strict).module()
    for b, t, seed in ((3, 5, 0), (3, 2, 1), (4, 7, 2)):
        args = inputs(b, t, seed)
        torch.testing.assert_close(program(*args), policy(*args), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(policy(*traced), before, rtol=0, atol=0)  # the eager module is unchanged
