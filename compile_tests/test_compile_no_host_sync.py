"""No host syncs in the compiled step, sequence and policy paths.

With ``capture_scalar_outputs=False`` (patched here explicitly, whatever the global value:
TorchRL may flip it), a tensor -> Python scalar conversion (``.item()``, ``.tolist()``,
``bool(t)``, a Python ``if`` on a tensor) cannot be traced, so Dynamo breaks the graph there;
``torch._dynamo.explain`` counts those breaks and ``fullgraph=True`` raises on them.
"""

from __future__ import annotations

import pytest
import torch

from compile_helpers import (
    SEQUENCE,
    STEP,
    as_state,
    hidden_keys,
    make_params,
    make_policy,
    make_sequence_case,
    policy_input,
)
from rnn_functional import set_recurrent_mode

NO_SCALARS = {"capture_scalar_outputs": False, "capture_dynamic_output_shape_ops": False}


def _breaks(fn, *args) -> list[str]:
    with torch._dynamo.config.patch(NO_SCALARS):
        report = torch._dynamo.explain(fn)(*args)
    return [str(b.reason) for b in report.break_reasons]


def test_detector_catches_a_host_sync():
    """Control: the same setup reports a break on .item() and a tensor-valued Python branch, and fullgraph raises."""

    def syncing(x):
        if (x > 0).any():  # data-dependent Python branch
            x = x + 1
        return x * x.sum().item()

    assert len(_breaks(syncing, torch.randn(3))) >= 1
    with torch._dynamo.config.patch(NO_SCALARS), pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(syncing, fullgraph=True, backend="eager")(torch.randn(3))


@pytest.mark.parametrize("backend", ["auto", "scan", "pad"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_sequence_with_resets_has_no_host_sync(cell, backend):
    params = make_params(cell, 2, 0, torch.float32)
    case = make_sequence_case(cell, 2, 0, "state", torch.float32)

    def fn(x, state, is_init, reset_state):
        return SEQUENCE[cell](x, as_state(cell, state), params, is_init=is_init,
                              reset_state=as_state(cell, reset_state), backend=backend)[0]

    assert _breaks(fn, case.x, case.state, case.is_init, case.reset_state) == []


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_with_resets_has_no_host_sync(cell):
    params = make_params(cell, 2, 0, torch.float32)

    def fn(x, is_init):
        return STEP[cell](x, None, params, is_init=is_init)[0]

    assert _breaks(fn, torch.randn(4, 3), torch.tensor([True, False, True, False])) == []


@pytest.mark.parametrize("mode", ["step", "batch", "ragged"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_policy_has_no_host_sync(cell, mode):
    policy = make_policy(cell)
    td = policy_input(cell, mode)
    with set_recurrent_mode(mode != "step"):
        assert _breaks(policy, td.clone()) == []
        out = torch.compile(policy, fullgraph=True, backend="eager")(td.clone())
    assert all(out["next", k].shape == td[k].shape for k in hidden_keys(cell))
