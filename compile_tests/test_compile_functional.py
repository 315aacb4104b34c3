"""torch.compile(fullgraph=True) of the functional core: step and sequence, forward and backward.

Every compiled result is compared with the eager ``reference`` backend, outputs and gradients
(wrt x, the initial state, reset_state and every parameter). ``fullgraph=True`` makes any
graph break an error; the Dynamo counters are checked too. See ``compile_helpers`` for the
compiler backends and tolerances.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf
import rnn_functional.functional._core as backends_mod
from compile_helpers import (
    FAST,
    FP32_TOL,
    LAYOUTS,
    SEQUENCE,
    STEP,
    as_parts,
    as_state,
    compile_stats,
    layout_id,
    make_params,
    make_sequence_case,
    run_with_grads,
    sequence_loss_fn,
    state_widths,
)


def _check_sequence(layout, resets, backend, compiler, dtype, tol, options=None, recompute="none"):
    cell, num_layers, proj = layout
    params = make_params(cell, num_layers, proj, dtype)
    case = make_sequence_case(cell, num_layers, proj, resets, dtype)
    want_out, want_grads = run_with_grads(sequence_loss_fn(cell, "reference"), case, params)
    fn = sequence_loss_fn(cell, backend, recompute=recompute)
    compiled = torch.compile(fn, fullgraph=True, backend=compiler, options=options)
    with compile_stats() as stats:
        got_out, got_grads = run_with_grads(compiled, case, params)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    for got, want in zip(got_out, want_out):
        torch.testing.assert_close(got, want, **tol)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("resets", ["none", "zeros", "state"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_sequence_auto_fullgraph_fwd_bwd_fp64(layout, resets):
    """backend='auto' compiles to one graph; outputs and all grads equal reference (fp64)."""
    _check_sequence(layout, resets, "auto", FAST, torch.float64, {})


@pytest.mark.parametrize("backend", ["scan", "pad"])
@pytest.mark.parametrize("layout", [("lstm", 2, 2), ("gru", 2, 0)], ids=layout_id)
def test_sequence_named_backend_fullgraph_fwd_bwd_fp64(layout, backend):
    """backend='scan', and 'pad' (routed to scan under compile), with reset_state: one graph, equal to reference."""
    _check_sequence(layout, "state", backend, FAST, torch.float64, {})


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_sequence_fullgraph_with_tied_biases(cell):
    """One tensor under two params keys (a shared bias): Dynamo refuses an ``autograd.Function`` given a tensor
    twice ("duplicate tensor input"), so ``scan`` hands its layer distinct views; outputs and the shared leaf's
    gradient (the sum over both keys) equal eager ``reference`` in fp64."""
    init = {"lstm": rf.init_lstm_params, "gru": rf.init_gru_params}[cell]
    g = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_() for k, v in init(3, 4, dtype=torch.float64, generator=g).items()}
    params["bias_hh_l0"] = params["bias_ih_l0"]
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=g)
    is_init = torch.rand(2, 5, generator=g) < 0.3

    def loss(backend):
        y, state = SEQUENCE[cell](x, None, params, is_init=is_init, backend=backend)
        return y.sin().sum() + sum(t.sum() for t in as_parts(cell, state))

    leaves = [params[k] for k in params if k != "bias_hh_l0"]
    want = loss("reference")
    got = torch.compile(loss, fullgraph=True, backend=FAST)("scan")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, leaves), torch.autograd.grad(want, leaves))


# Inductor's default in-place buffer reuse miscompiles the backward of torch's scan autograd on
# torch 2.13 (silently wrong recurrent-weight gradients for every layer of a two-layer model,
# pytorch/pytorch#153679, and for bias_hh of a one-layer GRU). Under compile the scan backend
# therefore differentiates through its own reverse scan; these cases guard that, with
# Inductor's default options and with in-place buffers off.
@pytest.mark.parametrize(
    "layout, options, recompute",
    [
        (("lstm", 2, 2), None, "none"),
        (("gru", 1, 0), None, "none"),
        (("gru", 2, 0), {"inplace_buffers": False}, "none"),
        (("gru", 2, 0), None, "full"),
    ],
    ids=["lstm-L2-proj2", "gru-L1", "gru-L2-inplace_buffers-off", "gru-L2-recompute"],
)
def test_sequence_inductor_fp32(layout, options, recompute):
    """Inductor (torch.compile's default compiler), float32, resets with reset_state: equal to reference within FP32_TOL."""
    _check_sequence(layout, "state", "scan", "inductor", torch.float32, FP32_TOL, options=options, recompute=recompute)


def _step_fn(cell):
    step = STEP[cell]

    def fn(x, state, params, is_init):
        y, new = step(x, as_state(cell, state), params, is_init=is_init)
        parts = as_parts(cell, new)
        return (y.sum() + sum(p.sum() for p in parts), y, *parts)

    return fn


def _check_step(layout, with_reset, compiler, dtype, tol):
    cell, num_layers, proj = layout
    params = make_params(cell, num_layers, proj, dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 3, generator=g, dtype=dtype).requires_grad_()  # *B = [2, 3], F = 3
    state = tuple(torch.randn(2, 3, num_layers, w, generator=g, dtype=dtype).requires_grad_()
                  for w in state_widths(cell, proj))
    is_init = torch.tensor([[True, False, True], [False, False, True]]) if with_reset else None
    leaves = [x, *state, *params.values()]

    def run(fn):
        out = fn(x, state, params, is_init)
        return [t.detach() for t in out], torch.autograd.grad(out[0], leaves)

    want_out, want_grads = run(_step_fn(cell))
    with compile_stats() as stats:
        got_out, got_grads = run(torch.compile(_step_fn(cell), fullgraph=True, backend=compiler))
    assert stats.breaks == 0 and stats.graphs == 1, stats
    for got, want in zip([*got_out, *got_grads], [*want_out, *want_grads]):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("with_reset", [False, True], ids=["no-reset", "is_init"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_step_fullgraph_fwd_bwd_fp64(layout, with_reset):
    """lstm_step / gru_step over batch dims [2, 3]: one graph; outputs and grads equal eager (fp64)."""
    _check_step(layout, with_reset, FAST, torch.float64, {})


def test_step_inductor_fp32():
    """Inductor, float32, two-layer LSTM with projection and resets: equal to eager within FP32_TOL."""
    _check_step(("lstm", 2, 2), True, "inductor", torch.float32, FP32_TOL)


def test_auto_resolves_to_scan_compiled_and_pad_eager(monkeypatch):
    """backend='auto' resolves to an eager ATen/loop route eagerly and to 'scan' under torch.compile; all agree."""
    resolved: list[str] = []
    real = backends_mod.choose

    def spy(*args, **kwargs):
        route = real(*args, **kwargs)
        resolved.append(route.backend)
        return route

    monkeypatch.setattr(backends_mod, "choose", spy)
    layout = ("lstm", 2, 0)
    params = make_params(*layout, torch.float32)
    case = make_sequence_case(*layout, "state", torch.float32)
    want_out, want_grads = run_with_grads(sequence_loss_fn("lstm", "reference"), case, params)
    resolved.clear()

    eager_out, eager_grads = run_with_grads(sequence_loss_fn("lstm", "auto"), case, params)
    assert resolved in (["pad"], ["reference"], ["scan"])  # auto's eager rule
    resolved.clear()
    compiled = torch.compile(sequence_loss_fn("lstm", "auto"), fullgraph=True, backend=FAST)
    comp_out, comp_grads = run_with_grads(compiled, case, params)
    assert resolved == ["scan"]  # recorded while tracing
    for a, b, ref in zip([*eager_out, *eager_grads], [*comp_out, *comp_grads], [*want_out, *want_grads]):
        torch.testing.assert_close(a, ref, **FP32_TOL)
        torch.testing.assert_close(b, ref, **FP32_TOL)
        torch.testing.assert_close(a, b, **FP32_TOL)
