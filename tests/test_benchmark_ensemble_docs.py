"""The ensemble section of docs/benchmarks.md is what ``benchmarks/bench_ensemble.py --report`` writes
from the committed sweep JSON (its table is never edited by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmarks" / "results" / "ensemble_sweep_cpu.json"


def test_ensemble_benchmark_section_is_generated() -> None:
    if not SWEEP.exists():
        pytest.skip("no ensemble sweep committed under benchmarks/results/")
    saved = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_ensemble  # puts benchmarks/ and the checkout on sys.path: restored below
    finally:
        sys.path[:] = saved
    expected = bench_ensemble.section(json.loads(SWEEP.read_text()), SWEEP.with_suffix(".png").name)
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert expected in page, "docs/benchmarks.md is out of date: run `python benchmarks/bench_ensemble.py --report`"
    assert (ROOT / "docs" / "assets" / "benchmarks" / SWEEP.with_suffix(".png").name).exists()
