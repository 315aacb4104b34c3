"""torch.compile of minGRU and RG-LRU (issue 30): ``parallel`` and ``scan`` with ``fullgraph=True``, a compiled
``torch.vmap`` over stacked params, forward and backward, fp64 at ``assert_close`` defaults against eager; one
Inductor compile of the default ``torch.compile(module)`` in recurrent mode (fp32, ``FP32_TOL``).

``aot_eager`` (``FAST``, see ``compile_helpers``) for the fp64 contracts. Sizes are tiny to keep the compiles short.
"""

from __future__ import annotations

import pytest
import torch
from compile_helpers import FAST, FP32_TOL, compile_stats
from tensordict import TensorDict

import rnn_functional as rf

F_IN, H, B, T = 3, 4, 2, 6
FUNCS = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence), "rglru": (rf.init_rglru_params, rf.rglru_sequence)}


def _case(cell: str, layers: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = FUNCS[cell][0](F_IN, H, layers, dtype=torch.float64, generator=g).apply(lambda t: t.requires_grad_())
    x = torch.randn(B, T, F_IN, generator=g, dtype=torch.float64).requires_grad_()
    h0 = torch.randn(B, layers, H, generator=g, dtype=torch.float64).requires_grad_()
    is_init = torch.zeros(B, T, dtype=torch.bool)
    is_init[0, 0] = is_init[1, 2] = is_init[0, 4] = True
    reset = torch.randn(B, T, layers, H, generator=g, dtype=torch.float64).requires_grad_()
    weights = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    return params, x, h0, is_init, reset, weights


def _with_grads(fn, leaves, *args):
    out = fn(*args)
    return tuple(o.detach() for o in out), torch.autograd.grad(out[0], leaves)


@pytest.mark.parametrize("cell", list(FUNCS))
@pytest.mark.parametrize("backend,recompute", [("parallel", "none"), ("parallel", "full"), ("scan", "none")])
def test_sequence_fullgraph_fwd_bwd_fp64(cell: str, backend: str, recompute: str) -> None:
    params, x, h0, is_init, reset, weights = _case(cell)

    def fn(x, h0, params, is_init, reset):
        y, h = FUNCS[cell][1](x, h0, params, is_init=is_init, reset_state=reset, backend=backend, recompute=recompute)
        return (y * weights).sum() + h.pow(2).sum(), y, h

    leaves = [x, h0, reset, *params.values()]
    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        got = _with_grads(compiled, leaves, x, h0, params, is_init, reset)
    assert stats.breaks == 0 and stats.graphs == 1, stats
    want = _with_grads(fn, leaves, x, h0, params, is_init, reset)
    torch.testing.assert_close(got, want)
    y_ref, h_ref = FUNCS[cell][1](x, h0, params, is_init=is_init, reset_state=reset, backend="reference")
    torch.testing.assert_close(got[0][1:], (y_ref.detach(), h_ref.detach()))


@pytest.mark.parametrize("cell", list(FUNCS))
def test_vmap_over_stacked_params_fullgraph_fwd_bwd(cell: str) -> None:
    """``torch.compile(torch.vmap(seq))`` (``auto``: ``parallel``) over two stacked members equals a loop, and a second
    shape (dynamic sizes) still compiles."""
    members = [_case(cell, seed=s)[0] for s in range(2)]
    stacked = torch.stack([m.detach() for m in members]).apply(lambda t: t.detach().requires_grad_())
    _, x, h0, is_init, reset, weights = _case(cell)

    def fn(x, h0, stacked, is_init, reset, weights):
        seq = lambda p: FUNCS[cell][1](x, h0, p, is_init=is_init, reset_state=reset)  # noqa: E731
        y, h = torch.vmap(seq)(stacked)
        return (y * weights).sum() + h.pow(2).sum(), y, h

    def loop(x, h0, stacked, is_init, reset, weights):
        outs = [FUNCS[cell][1](x, h0, stacked[i], is_init=is_init, reset_state=reset, backend="reference") for i in range(2)]
        y, h = torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])
        return (y * weights).sum() + h.pow(2).sum(), y, h

    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    for t_len in (T, T + 3):  # the second call recompiles with dynamic sizes
        xs, is_i, rs, ws = x[:, :1].expand(B, t_len, F_IN), is_init[:, :1].expand(B, t_len), reset[:, :1].expand(
            B, t_len, 2, H), weights[:, :1].expand(B, t_len, H)
        xs, is_i, rs, ws = xs.contiguous(), is_i.contiguous(), rs.contiguous(), ws.contiguous()
        leaves = [*stacked.values()]
        torch.testing.assert_close(_with_grads(compiled, leaves, xs, h0, stacked, is_i, rs, ws),
                                   _with_grads(loop, leaves, xs, h0, stacked, is_i, rs, ws))


@pytest.mark.parametrize("module_class", [rf.MinGRUModule, rf.RGLRUModule])
def test_default_compile_of_the_module_in_both_modes(module_class) -> None:
    """A plain ``torch.compile(module)`` (Inductor), recurrent mode with resets, then a step; fp32 within ``FP32_TOL``."""
    torch.manual_seed(0)
    module = module_class(F_IN, H, num_layers=2, in_key="obs", out_key="feat")
    td = TensorDict({"obs": torch.randn(B, T, F_IN), "is_init": torch.rand(B, T, 1) < 0.3,
                     "recurrent_state": torch.randn(B, T, 2, H)}, [B, T])
    compiled = torch.compile(module)
    with rf.set_recurrent_mode(True):
        got, want = compiled(td.clone()), module(td.clone())
    for key in ("feat", ("next", "recurrent_state")):
        torch.testing.assert_close(got[key], want[key], **FP32_TOL)
    step = td[:, 0].clone()
    torch.testing.assert_close(compiled(step.clone())["feat"], module(step.clone())["feat"], **FP32_TOL)


@pytest.mark.parametrize("cell", list(FUNCS))
def test_non_finite_values_do_not_cross_a_reset_compiled(cell: str) -> None:
    """Compiled ``parallel`` (plain ops under autograd) keeps every reset as eagerly (``tests/test_linear_cells.py``):
    a NaN initial state erased at t = 0, a NaN input after a reset in the same chunk as it (T = 13: chunks of 4; the
    chunk's product of ``a`` once sent NaN to the steps before the reset through its backward), a NaN ``reset_state``
    where ``is_init`` is False: outputs and gradients equal eager ``reference``'s, NaN exactly where its are."""
    g = torch.Generator().manual_seed(3)
    params = FUNCS[cell][0](F_IN, H, 2, dtype=torch.float64, generator=g).apply(lambda t: t.requires_grad_())
    x = torch.randn(B, 13, F_IN, generator=g, dtype=torch.float64)
    x[0, 6] = float("nan")
    x.requires_grad_()
    h0 = torch.randn(B, 2, H, generator=g, dtype=torch.float64)
    h0[1] = float("nan")
    is_init = torch.zeros(B, 13, dtype=torch.bool)
    is_init[:, 0] = is_init[0, 5] = is_init[0, 9] = is_init[1, 7] = True
    reset = torch.randn(B, 13, 2, H, generator=g, dtype=torch.float64)
    reset[~is_init] = float("nan")
    reset.requires_grad_()
    weights = torch.randn(B, 13, H, generator=g, dtype=torch.float64)

    def fn(x, params, reset, backend):
        y, h = FUNCS[cell][1](x, h0, params, is_init=is_init, reset_state=reset, backend=backend)
        return (y * weights).sum() + h[1].pow(2).sum(), y, h

    leaves = [x, reset, *params.values()]
    got = _with_grads(torch.compile(fn, fullgraph=True, backend=FAST), leaves, x, params, reset, "parallel")
    want = _with_grads(fn, leaves, x, params, reset, "reference")
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isfinite(got[1][0][0, :5]).all() and torch.isfinite(got[0][1][0, 9:]).all()


def test_recurrentgemma_segment_starts_compile_whole_on_scan() -> None:
    """``segment_start="recurrentgemma"`` under the default ``torch.compile`` (Inductor) with ``fullgraph=True`` on
    ``scan``: one graph, no break, forward and backward (the hand-written reverse scan reading the start mask) equal
    eager ``reference`` with the option in fp64 at ``assert_close`` defaults; resets at t = 0 and inside. One layer:
    an Inductor compile of the scan takes long."""
    params, x, h0, is_init, reset, weights = _case("rglru", layers=1)

    def fn(x, h0, params, is_init, reset, backend):
        y, h = rf.rglru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend,
                                 segment_start="recurrentgemma")
        return (y * weights).sum() + h.pow(2).sum(), y, h

    leaves = [x, h0, reset, *params.values()]
    with compile_stats() as stats:
        got = _with_grads(torch.compile(fn, fullgraph=True), leaves, x, h0, params, is_init, reset, "scan")
    assert stats.breaks == 0 and stats.graphs == 1, stats
    torch.testing.assert_close(got, _with_grads(fn, leaves, x, h0, params, is_init, reset, "reference"))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_recurrentgemma_segment_starts_in_a_compiled_vmapped_ensemble_on_scan(recompute: str) -> None:
    """The compiled ``torch.vmap`` ensemble's ``scan`` layer (the ``scan_ensemble_layer`` op) with the option: the
    start mask reaches each member's step and its backward (saved, or recomputed); gradients equal a loop of
    ``reference`` calls (fp64, ``assert_close`` defaults)."""
    members = [_case("rglru", layers=1, seed=s)[0] for s in range(2)]
    stacked = torch.stack([m.detach() for m in members]).apply(lambda t: t.detach().requires_grad_())
    _, x, h0, is_init, reset, weights = _case("rglru", layers=1)
    x, h0, reset = x.detach(), h0.detach(), reset.detach()

    def run(params, backend):
        y, h = rf.rglru_sequence(x, h0, params, is_init=is_init, reset_state=reset, backend=backend,
                                 recompute=recompute if backend == "scan" else "none", segment_start="recurrentgemma")
        return (y * weights).sum() + h.pow(2).sum()

    compiled = torch.compile(lambda p: torch.vmap(lambda m: run(m, "scan"))(p).sum(), fullgraph=True, backend=FAST)
    leaves = list(stacked.values())
    got = torch.autograd.grad(compiled(stacked), leaves)
    torch.testing.assert_close(got, torch.autograd.grad(sum(run(stacked[i], "reference") for i in range(2)), leaves))
