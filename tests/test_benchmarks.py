"""The benchmarks' shared timing helper and the ensemble benchmark: its GEMM floor, and the docs section its
``--report`` writes from the committed sweep JSON (that table is never edited by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SWEEP = BENCHMARKS / "results" / "ensemble_sweep_cpu.json"


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


def test_ensemble_benchmark_section_is_generated(benchmarks_on_path) -> None:
    if not SWEEP.exists():
        pytest.skip("no ensemble sweep committed under benchmarks/results/")
    import bench_ensemble

    expected = bench_ensemble.section(json.loads(SWEEP.read_text()), SWEEP.with_suffix(".png").name)
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert expected in page, "docs/benchmarks.md is out of date: run `python benchmarks/bench_ensemble.py --report`"
    assert (ROOT / "docs" / "assets" / "benchmarks" / SWEEP.with_suffix(".png").name).exists()


def test_torchrl_reset_benchmark_section_is_generated(benchmarks_on_path) -> None:
    """The table of TorchRL's own recurrent-backend benchmark in the docs comes from the committed JSON."""
    results = BENCHMARKS / "results" / "torchrl_reset_cpu.json"
    if not results.exists():
        pytest.skip("no TorchRL reset benchmark committed under benchmarks/results/")
    import bench_torchrl_reset

    doc = json.loads(results.read_text())
    assert bench_torchrl_reset.summary(doc["rows"]) == doc["summary"]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert bench_torchrl_reset.section(doc) in page, (
        "docs/benchmarks.md is out of date: run `python benchmarks/bench_torchrl_reset.py --report`")
