"""The benchmarks' shared timing helper and the ensemble benchmark's GEMM floor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmarks_on_path():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield
    finally:
        sys.path[:] = saved


@pytest.mark.parametrize("settle", [False, True])
def test_interleaved_settle_calls_each_contender_once_more_before_each_timed_call(benchmarks_on_path, settle) -> None:
    from _timing import interleaved

    log: list[str] = []
    contenders = {name: (lambda name=name: log.append(name)) for name in ("a", "b")}
    results = interleaved(contenders, torch.device("cpu"), warmup=1, repeats=3, keep_rounds=True, settle=settle)
    assert [results[n]["samples"] for n in "ab"] == [3, 3]
    assert [log.count(n) for n in "ab"] == ([1 + 2 * 3] * 2 if settle else [1 + 3] * 2)
    timed = log[2:]  # after one warm-up call each
    if settle:  # every call is paired with the next one of the same contender: untimed, then timed
        assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_ensemble_gemm_floor_flops_match_its_products(benchmarks_on_path, cell) -> None:
    """``floor_flops`` (the GFLOP/s the report prints) counts exactly the products the floor contender runs."""
    import bench_ensemble

    e, b, t, h = 3, 4, 5, 8
    floor = bench_ensemble.build_contenders(cell, e, b, t, h, ["GEMM floor"])["GEMM floor"]
    with FlopCounterMode(display=False) as counter:
        floor()
    assert counter.get_total_flops() == bench_ensemble.floor_flops(cell, e, b, t, h)
