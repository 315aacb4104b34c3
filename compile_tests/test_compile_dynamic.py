"""Recompiles: bounded across batch sizes and sequence lengths, none across reset patterns.

A function compiled with the default ``dynamic=None`` is first specialised to the shapes of its
first call; the first call with other sizes recompiles it once with those dims symbolic
(automatic dynamic shapes), and no later size recompiles it. So 4 batch sizes x 4 lengths
cost at most 2 graphs per mode. ``is_init`` is data, never a Python branch: any reset pattern
reuses the graph. Sizes 0 and 1 are specialised by Dynamo and would add a graph each; they are
not used here (see docs/compile.md). Recompiles are decided by Dynamo's guards, before any
compiler backend runs, so the cheap ``aot_eager`` backend counts them exactly.
"""

from __future__ import annotations

import pytest
import torch

import rnn_functional as rf
from compile_helpers import (
    FAST,
    FP32_TOL,
    SEQUENCE,
    STEP,
    as_parts,
    call_policy,
    compile_stats,
    make_params,
    make_policy,
    policy_input,
    reset_mask,
)

# (B, T) per call: 4 batch sizes and 4 lengths, none equal to another size (Dynamo would
# otherwise guard on the equality) nor to F_IN=3 / H=4 used by the models
SIZES = [(2, 5), (6, 7), (8, 9), (10, 11)]


def _reset_patterns(batch, time):
    return [
        torch.zeros(batch, time, dtype=torch.bool),
        torch.ones(batch, time, dtype=torch.bool),
        reset_mask(batch, time, seed=1),
        reset_mask(batch, time, seed=2, p=0.7),
    ]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_sequence_recompiles_at_most_once_across_shapes_and_never_for_resets(cell):
    params = make_params(cell, 2, 0, torch.float32)
    seq = SEQUENCE[cell]

    def fn(x, is_init):
        y, state = seq(x, None, params, is_init=is_init)
        return (y, *as_parts(cell, state))

    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as shapes:
        for batch, time in SIZES:
            x = torch.randn(batch, time, 3)
            is_init = reset_mask(batch, time)
            torch.testing.assert_close(compiled(x, is_init), fn(x, is_init), **FP32_TOL)
    assert shapes.breaks == 0 and shapes.graphs <= 2, shapes
    with compile_stats() as resets:
        for is_init in _reset_patterns(batch, time):
            torch.testing.assert_close(compiled(x, is_init), fn(x, is_init), **FP32_TOL)
    assert resets.graphs == 0, resets


@pytest.mark.parametrize("cell", ["min_gru", "rglru"])
def test_linear_cells_on_scan_recompile_at_most_once_across_lengths(cell):
    """What docs/compile.md recommends for lengths that vary from call to call with these cells: ``parallel``
    (what ``auto`` runs) unrolls its chunked scan by ``T``'s value and compiles one graph per length; ``scan``'s
    graph serves every length."""
    init, seq = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence),
                 "rglru": (rf.init_rglru_params, rf.rglru_sequence)}[cell]
    params = init(3, 4, generator=torch.Generator().manual_seed(0))

    def fn(x, is_init):
        return seq(x, None, params, is_init=is_init, backend="scan")

    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as shapes:
        for time in (5, 7, 9, 11, 13, 17):
            x = torch.randn(2, time, 3)
            is_init = reset_mask(2, time)
            for got, want in zip(compiled(x, is_init), fn(x, is_init), strict=True):
                torch.testing.assert_close(got, want, **FP32_TOL)
    assert shapes.breaks == 0 and shapes.graphs <= 2, shapes


DYNAMIC_CELLS = {"rglru": (lambda: rf.init_rglru_params(3, 4), rf.rglru_sequence),
                 "min_gru": (lambda: rf.init_min_gru_params(3, 4), rf.min_gru_sequence),
                 "norm_gru": (lambda: rf.init_norm_gru_params(3, 4), rf.norm_gru_sequence),
                 "block_gru": (lambda: rf.init_block_gru_params(3, 8, projection_size=4, num_blocks=2),
                               rf.block_gru_sequence)}


# Each cell with recompute="full" (its forward and its recomputing backward). Without recompute the GRU and the block
# GRU run in test_dynamic_true_training_serves_two_steps_without_recompiling below; the other cells' saving steps run
# in the same hand-written scan layer, so their dynamic cases would repeat that path at ~30-90 s each of Dynamo's
# symbolic shapes on 2 cores (the norm GRU's own saving layer is compiled in tests/test_scan_saved.py and
# test_compile_as_called.py, with static shapes).
DYNAMIC_CASES = [("rglru", "full"), ("min_gru", "full"), ("norm_gru", "full"), ("block_gru", "full")]


@pytest.mark.parametrize(("cell", "recompute"), DYNAMIC_CASES)
def test_dynamic_true_trains_on_scan(cell, recompute):
    """``torch.compile(..., dynamic=True)`` (docs/compile.md's way to avoid the shape recompile) over a training call
    on ``scan``: outputs and input gradients equal eager ``reference``. Dynamo makes float globals and attributes
    graph inputs there: RG-LRU failed inside Dynamo ("lift_tracked_freevar_to_input should not be called on root
    SubgraphTracer") while its gate scale was a float global (now an int), the block GRU on its norm's ``eps``, a
    ``SymFloat`` that ``scan`` refuses (now a constant of the graph), the norm GRU with ``recompute="full"`` on its
    norm's ``eps`` (now a literal)."""
    init, seq = DYNAMIC_CELLS[cell]
    torch.manual_seed(0)
    params = init()
    compiled = torch.compile(lambda x: seq(x, None, params, backend="scan", recompute=recompute), dynamic=True,
                             backend=FAST)
    x = torch.randn(2, 5, 3, requires_grad=True)
    got, want = compiled(x), seq(x, None, params, backend="reference")
    for a, b in zip([*got, *torch.autograd.grad(got[0].sum(), x)], [*want, *torch.autograd.grad(want[0].sum(), x)],
                    strict=True):
        torch.testing.assert_close(a, b, **FP32_TOL)


@pytest.mark.parametrize("cell", ["gru", "block_gru"])
def test_dynamic_true_training_serves_two_steps_without_recompiling(cell):
    """``dynamic=True`` with a backward, T = 5 then T = 2: one graph. The backward read the carries before each step
    as ``states[: T - 1]``, whose traced view guards ``T - 1 != 1``, so every T = 2 call recompiled."""
    init, seq = (lambda: make_params("gru", 1, 0, torch.float32), SEQUENCE["gru"]) if cell == "gru" \
        else DYNAMIC_CELLS[cell]
    torch.manual_seed(0)
    params = init()
    compiled = torch.compile(lambda x, is_init: seq(x, None, params, is_init=is_init, backend="scan")[0],
                             dynamic=True, backend=FAST)
    with compile_stats() as stats:
        for batch, time in [(5, 6), (6, 2), (9, 7)]:  # no size equal to another (Dynamo guards on equal sizes)
            x, is_init = torch.randn(batch, time, 3, requires_grad=True), reset_mask(batch, time)
            got = compiled(x, is_init)
            want = seq(x, None, params, is_init=is_init, backend="reference")[0]
            for a, b in zip([got, *torch.autograd.grad(got.sum(), x)], [want, *torch.autograd.grad(want.sum(), x)]):
                torch.testing.assert_close(a, b, **FP32_TOL)
    assert stats.breaks == 0 and stats.graphs == 1, stats


def test_sequence_mark_dynamic_compiles_once():
    """B and T marked dynamic before the first call: a single graph serves every size."""
    params = make_params("lstm", 1, 2, torch.float32)

    def fn(x, is_init):
        return SEQUENCE["lstm"](x, None, params, is_init=is_init)[0]

    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        for batch, time in SIZES:
            x, is_init = torch.randn(batch, time, 3), reset_mask(batch, time)
            for t in (x, is_init):
                torch._dynamo.mark_dynamic(t, 0)
                torch._dynamo.mark_dynamic(t, 1)
            torch.testing.assert_close(compiled(x, is_init), fn(x, is_init), **FP32_TOL)
    assert stats.breaks == 0 and stats.graphs == 1, stats


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_recompiles_at_most_once_across_batch_sizes(cell):
    params = make_params(cell, 1, 0, torch.float32)
    step = STEP[cell]

    def fn(x, is_init):
        return step(x, None, params, is_init=is_init)[0]

    compiled = torch.compile(fn, fullgraph=True, backend=FAST)
    with compile_stats() as stats:
        for batch, _ in SIZES:
            x = torch.randn(batch, 3)
            for is_init in (torch.zeros(batch, dtype=torch.bool), torch.arange(batch) % 3 == 0):
                torch.testing.assert_close(compiled(x, is_init), fn(x, is_init), **FP32_TOL)
    assert stats.breaks == 0 and stats.graphs <= 2, stats


@pytest.mark.parametrize("mode", ["step", "batch", "ragged"])
def test_policy_recompiles_at_most_once_per_mode(mode):
    """The compiled LSTM policy over 4 batch sizes (and 4 lengths): at most one recompile; resets never recompile."""
    policy = make_policy("lstm")
    compiled = torch.compile(policy, fullgraph=True, backend=FAST)
    with compile_stats() as shapes:
        for seed, (batch, time) in enumerate(SIZES):
            td = policy_input("lstm", mode, batch=batch, time=time, seed=seed)
            got, want = call_policy(compiled, td, mode), call_policy(policy, td, mode)
            torch.testing.assert_close(got["logits"], want["logits"], **FP32_TOL)
    assert shapes.breaks == 0 and shapes.graphs <= 2, shapes
    with compile_stats() as resets:
        for pattern in _reset_patterns(batch, time):
            is_init = pattern[:, 0] if mode == "step" else pattern
            td = policy_input("lstm", mode, batch=batch, time=time, is_init=is_init)
            got, want = call_policy(compiled, td, mode), call_policy(policy, td, mode)
            torch.testing.assert_close(got["logits"], want["logits"], **FP32_TOL)
    assert resets.graphs == 0, resets
