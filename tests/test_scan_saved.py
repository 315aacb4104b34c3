"""The ``scan`` backend's hand-written layer: saved activations (``recompute="none"``) and recomputation
(``"full"``), eagerly (a Python time loop) and compiled (torch's ``scan``), against ``reference``.

Outputs and gradients of ``x``, the state, ``reset_state`` and every parameter, in float64 at
``torch.testing.assert_close`` defaults; every cell kind, one and two layers, interior resets.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf
from rnn_functional.backends import scan_parts
from rnn_functional.cells import LayerWeights
from rnn_functional.cells.gru import GRU
from rnn_functional.cells.lstm import LSTM
from rnn_functional.cells.norm_gru import NORM_GRU

F64 = torch.float64
N, T, F, H = 3, 6, 4, 5
CELLS = {  # name -> (init, sequence function, state widths given proj)
    "lstm": (rf.init_lstm_params, rf.lstm_sequence),
    "lstm_proj": (lambda *a, **k: rf.init_lstm_params(*a, proj_size=3, **k), rf.lstm_sequence),
    "gru": (rf.init_gru_params, rf.gru_sequence),
    "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence),
}


def _widths(cell: str) -> tuple[int, ...]:
    return {"lstm": (H, H), "lstm_proj": (3, H), "gru": (H,), "norm_gru": (H,)}[cell]


def _problem(cell: str, layers: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    init, seq = CELLS[cell]
    params = init(F, H, layers, dtype=F64, generator=g).requires_grad_(True)
    state = [torch.randn(N, layers, w, dtype=F64, generator=g, requires_grad=True) for w in _widths(cell)]
    reset = [torch.randn(N, T, layers, w, dtype=F64, generator=g, requires_grad=True) for w in _widths(cell)]
    x = torch.randn(N, T, F, dtype=F64, generator=g, requires_grad=True)
    is_init = torch.zeros(N, T, dtype=torch.bool)
    is_init[0, 0] = is_init[0, 3] = is_init[1, 5] = is_init[2, 1] = is_init[2, 2] = True
    pack = (lambda ts: tuple(ts)) if len(state) == 2 else (lambda ts: ts[0])

    def loss(backend: str, recompute: str, x=x, params=params):
        y, final, seg = seq(x, pack(state), params, is_init=is_init, reset_state=pack(reset), backend=backend,
                            recompute=recompute, return_segment_states=True)
        final, seg = (final, seg) if isinstance(final, tuple) else ((final,), (seg,))
        return y, y.sin().sum() + sum((s**2).sum() for s in final) + sum((1.3 * s).cos().sum() for s in seg)

    return loss, [x, *state, *reset, *params.values()]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", list(CELLS))
def test_eager_scan_matches_reference(cell: str, layers: int, recompute: str) -> None:
    """Eager ``scan`` (Python loop, hand-written backward) == ``reference``: outputs and every gradient."""
    loss, leaves = _problem(cell, layers)
    y_ref, l_ref = loss("reference", "none")
    y, value = loss("scan", recompute)
    torch.testing.assert_close(y, y_ref)
    for got, want in zip(torch.autograd.grad(value, leaves), torch.autograd.grad(l_ref, leaves)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cell", ["lstm", "gru", "norm_gru", "block_gru"])
def test_backward_in_several_spans_matches_reference(cell: str) -> None:
    """The eager backward runs a few steps at a time (spans of ``scan_parts.CHUNK_BYTES`` of a state-wide tensor,
    factors computed and weight gradients reduced per span): at N=64, H=64 in fp64 that is 8 steps, so T=21 runs two
    whole spans and a partial one. Outputs and every gradient (x strided, the state, reset_state, the params) equal
    ``reference``."""
    n, t_len, f, h = 64, 21, 6, 64
    assert t_len > scan_parts.CHUNK_BYTES // (n * h * 8) * 2  # three spans, the last one partial
    g = torch.Generator().manual_seed(7)
    block_gru = (lambda *a, **k: rf.init_block_gru_params(*a, projection_size=16, num_blocks=4, **k), rf.block_gru_sequence)
    init, seq = {**CELLS, "block_gru": block_gru}[cell]
    params = init(f, h, dtype=F64, generator=g).apply(lambda p: p.requires_grad_())
    widths = (h, h) if cell == "lstm" else (h,)
    state = [torch.randn(n, 1, w, dtype=F64, generator=g, requires_grad=True) for w in widths]
    reset = [torch.randn(n, t_len, 1, w, dtype=F64, generator=g, requires_grad=True) for w in widths]
    x = torch.randn(t_len, n, f, dtype=F64, generator=g).transpose(0, 1).requires_grad_()
    is_init = torch.rand(n, t_len, generator=g) < 0.1
    pack = (lambda ts: tuple(ts)) if len(widths) == 2 else (lambda ts: ts[0])
    leaves = [x, *state, *reset, *params.values()]
    results = []
    for backend in ("reference", "scan"):
        y, final = seq(x, pack(state), params, is_init=is_init, reset_state=pack(reset), backend=backend)
        final = final if isinstance(final, tuple) else (final,)
        loss = y.sin().sum() + sum((s**2).sum() for s in final)
        results.append((y, torch.autograd.grad(loss, leaves)))
    (y_ref, g_ref), (y_scan, g_scan) = results
    torch.testing.assert_close(y_scan, y_ref)
    for a, b in zip(g_scan, g_ref, strict=True):
        torch.testing.assert_close(a, b)


def test_eager_scan_runs_no_scan_operator(monkeypatch) -> None:
    """Eagerly the time loop is plain Python: torch's scan operator (traced and compiled per call) never runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch's scan ran eagerly")

    monkeypatch.setattr(scan_parts, "scan", refuse)
    loss, leaves = _problem("gru", 2)
    _, value = loss("scan", "none")
    torch.autograd.grad(value, leaves)


@pytest.mark.parametrize("cell", [LSTM, GRU, NORM_GRU], ids=["lstm", "gru", "norm_gru"])
@pytest.mark.parametrize("proj", [False, True], ids=["", "proj"])
def test_cell_saved_backward_is_the_vjp_of_its_step(cell, proj: bool) -> None:
    """``step_backward_saved(backward_factors(saved))`` == autograd's vjp of ``layer_step``, and the step
    with its saved activations computes the same carry as ``layer_step``."""
    if proj and cell is not LSTM:
        pytest.skip("only the LSTM has a projection")
    g = torch.Generator().manual_seed(1)
    params = {"lstm": lambda: rf.init_lstm_params(F, H, proj_size=3 if proj else 0, dtype=F64, generator=g),
              "gru": lambda: rf.init_gru_params(F, H, dtype=F64, generator=g),
              "norm_gru": lambda: rf.init_norm_gru_params(F, H, dtype=F64, generator=g)}[cell.name]()
    layout = cell.read_layout(dict(params.items()))
    w = cell.layer_weights(dict(params.items()), layout, 0)
    w = LayerWeights.from_tensors([None if t is None else t.detach().requires_grad_(True) for t in w.tensors()])
    gi = torch.randn(N, w.weight_hh.shape[0], dtype=F64, generator=g, requires_grad=True)
    carry = tuple(torch.randn(N, s, dtype=F64, generator=g, requires_grad=True) for s in layout.state_sizes)
    d_new = tuple(torch.randn(N, s, dtype=F64, generator=g) for s in layout.state_sizes)

    new, saved = cell.layer_step_saving(gi, carry, w)
    for a, b in zip(new, cell.layer_step(gi, carry, w)):
        torch.testing.assert_close(a, b)
    if cell is LSTM:  # what a step keeps for its backward: the four activated gates, 4H (no tanh(c'))
        assert [tuple(t.shape) for t in saved] == [(N, layout.hidden_size)] * 4
    extra = [t for t in w.extra if t is not None]
    want = torch.autograd.grad(new, [*carry, gi, w.weight_hh, *extra], d_new)
    with torch.no_grad():
        got = cell.step_backward_saved(cell.backward_factors(saved, carry, w), carry, w, d_new)
    d_gh = got.d_gi if got.d_gh is None else got.d_gh
    h = carry[0]
    for a, b in zip(got.d_carry, want[: len(carry)]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got.d_gi, want[len(carry)])
    torch.testing.assert_close(d_gh.transpose(0, 1) @ h, want[len(carry) + 1])
    for a, b in zip([d for d in got.d_extra if d is not None], want[len(carry) + 2 :]):
        torch.testing.assert_close(a, b)


def test_compiled_norm_gru_two_layers() -> None:
    """fullgraph, ``aot_eager``: the saved-activation layer of the norm GRU traced forward and backward, two layers,
    resets with ``reset_state``, float64 == ``reference``. (Inductor's code for this layer: the norm GRU under the
    default compile in compile_tests/test_compile_as_called.py; LSTM and GRU, both modes: compile_tests/.)"""
    torch._dynamo.reset()
    loss, leaves = _problem("norm_gru", 2, seed=3)
    compiled = torch.compile(lambda: loss("scan", "none"), fullgraph=True, backend="aot_eager")
    y, value = compiled()
    y_ref, l_ref = loss("reference", "none")
    torch.testing.assert_close(y, y_ref)
    for got, want in zip(torch.autograd.grad(value, leaves), torch.autograd.grad(l_ref, leaves)):
        torch.testing.assert_close(got, want)
