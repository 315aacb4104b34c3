"""Property tests of the reset semantics (hypothesis): random shapes and ``is_init`` patterns.

- no information crosses a reset: the outputs of a segment equal a fresh run of that
  segment alone, starting from its ``reset_state`` (or zeros);
- every eager backend equals ``reference``.
"""

from __future__ import annotations

import torch
from helpers import CELLS, flat, pack_state, state_sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


SETTINGS = dict(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw):
    cell = draw(st.sampled_from(["lstm", "gru"]))
    batch = draw(st.integers(1, 4))
    time = draw(st.integers(1, 8))
    layers = draw(st.integers(1, 2))
    hidden = draw(st.integers(1, 5))
    proj = draw(st.integers(0, hidden - 1)) if cell == "lstm" and hidden > 1 else 0
    mask = draw(st.lists(st.booleans(), min_size=batch * time, max_size=batch * time))
    use_reset_state = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    kwargs = {"proj_size": proj} if cell == "lstm" else {}
    params = CELLS[cell][0](3, hidden, layers, dtype=torch.float64, generator=g, **kwargs)
    sizes = state_sizes(cell, hidden, proj)
    x = torch.randn(batch, time, 3, generator=g, dtype=torch.float64)
    state = [torch.randn(batch, layers, s, generator=g, dtype=torch.float64) for s in sizes]
    reset = [torch.randn(batch, time, layers, s, generator=g, dtype=torch.float64) for s in sizes] if use_reset_state else None
    is_init = torch.tensor(mask, dtype=torch.bool).reshape(batch, time)
    return cell, params, x, state, is_init, reset


@settings(**SETTINGS)
@given(problems())
def test_no_information_crosses_a_reset(problem) -> None:
    cell, params, x, state, is_init, reset = problem
    seq = CELLS[cell][2]
    y, _ = seq(
        x, pack_state(cell, state), params, is_init=is_init,
        reset_state=None if reset is None else pack_state(cell, reset), backend="reference",
    )
    for b in range(x.shape[0]):
        starts = [t for t in range(x.shape[1]) if is_init[b, t]]
        for i, t0 in enumerate(starts):
            t1 = starts[i + 1] if i + 1 < len(starts) else x.shape[1]
            init = [r[b : b + 1, t0] for r in reset] if reset is not None else None
            y_alone, _ = seq(
                x[b : b + 1, t0:t1], None if init is None else pack_state(cell, init), params, backend="reference"
            )
            torch.testing.assert_close(y[b : b + 1, t0:t1], y_alone)
        # Perturbing everything before the last reset leaves everything after it unchanged.
        if starts:
            x2 = x.clone()
            x2[b, : starts[-1]] += 1.0
            y2, _ = seq(
                x2, pack_state(cell, state), params, is_init=is_init,
                reset_state=None if reset is None else pack_state(cell, reset), backend="reference",
            )
            torch.testing.assert_close(y2[b, starts[-1] :], y[b, starts[-1] :])


def _assert_backend_equals_reference(problem, backend: str) -> None:
    cell, params, x, state, is_init, reset = problem
    seq = CELLS[cell][2]
    args = dict(is_init=is_init, reset_state=None if reset is None else pack_state(cell, reset), return_segment_states=True)
    expected = seq(x, pack_state(cell, state), params, backend="reference", **args)
    torch.testing.assert_close(flat(seq(x, pack_state(cell, state), params, backend=backend, **args)), flat(expected))


@settings(**SETTINGS)
@given(problems())
def test_pad_equals_reference(problem) -> None:
    _assert_backend_equals_reference(problem, "pad")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_scan_equals_reference(problem) -> None:
    # Fewer examples: eager scan re-traces per new shape (~1 s each here).
    _assert_backend_equals_reference(problem, "scan")
