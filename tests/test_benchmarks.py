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


def test_a_budget_cut_run_keeps_every_finished_row_and_says_so(benchmarks_on_path, tmp_path) -> None:
    """``run.py --budget-s``: rows start while the budget lasts, the JSON is rewritten after each and its coverage
    says how many of the planned rows ran (what a GPU lease's step brings back when its time is short)."""
    import run

    out = tmp_path / "suite.json"
    args = ["--grid", "quick", "--device", "cpu", "--cells", "gru", "--B", "2", "--T", "3", "--reset-probs", "0.5",
            "--policy-B", "2", "--out", str(out)]
    run.main([*args, "--budget-s", "0"])
    cut = json.loads(out.read_text())
    assert cut["coverage"] == {"budget_s": 0.0, "rows_done": 0, "rows_planned": 3, "complete": False}
    assert cut["sequence"] == [] and cut["policy_step"] == []
    run.main(args)
    whole = json.loads(out.read_text())
    assert whole["coverage"]["complete"] and len(whole["sequence"]) == 2 and len(whole["policy_step"]) == 1


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


PER_CALL = BENCHMARKS / "results" / "per_call_cpu.json"
PER_CALL_ROW_KEYS = {"group", "name", "cell", "threads", "ours", "baseline", "ours_us", "ours_min_us", "base_us",
                     "base_min_us", "ratio", "diff_us", "metric", "target", "met"}


def test_per_call_benchmark_quick_run_writes_rows_and_its_docs_section(benchmarks_on_path, tmp_path) -> None:
    """A ``--quick`` run (no policy compile: ~5 s; compile_tests/ cover the compiled policy) writes every row with its target check, and ``--report``
    puts the section generated from that JSON between its markers, once, leaving the rest of the page as it was."""
    import os
    import subprocess

    import bench_per_call

    out = tmp_path / "per_call.json"
    groups = ["step", "module", "tiny", "recurrent"]
    import rnn_functional

    # the subprocess imports the rnn_functional this process imported (the checkout's under `PYTHONPATH=.`)
    library = str(Path(rnn_functional.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [library, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_per_call.py"), "--quick", "--threads", "1", "--groups", *groups,
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["settings"]["quick"] and doc["settings"]["threads"] == [1]
    assert {"device_name", "cpu_count", "torch", "tensordict", "date"} <= doc["environment"].keys()
    rows = doc["rows"]
    assert [(r["group"], r["cell"]) for r in rows] == [
        (g, cell) for cell in ("lstm", "gru") for g in ("step", "module", "tiny", "tiny", "recurrent")]
    for r in rows:
        assert PER_CALL_ROW_KEYS <= r.keys() and "error" not in r, r
        assert r["threads"] == 1 and isinstance(r["met"], bool)
        assert r["ratio"] == pytest.approx(r["ours_us"] / r["base_us"])
        assert r["diff_us"] == pytest.approx(r["ours_us"] - r["base_us"])
        assert 0 < r["ours_min_us"] <= r["ours_us"] and 0 < r["base_min_us"] <= r["base_us"]
        assert r["met"] == (r[r["metric"]] <= r["target"])
    targets = {(r["group"], r["ours"].split(" ")[0].endswith("Module")): (r["metric"], r["target"]) for r in rows}
    assert targets == {("step", False): ("ratio", 1.3), ("module", True): ("ratio", 1.6),
                       ("tiny", False): ("diff_us", 20.0), ("tiny", True): ("diff_us", 50.0),
                       ("recurrent", True): ("ratio", 1.03)}
    assert doc["summary"] == {"rows": len(rows), "met": sum(r["met"] for r in rows),
                              "not_met": [f"{r['name']} ({r['threads']} thread(s))" for r in rows if not r["met"]]}

    original = (ROOT / "docs" / "benchmarks.md").read_text()
    page = tmp_path / "benchmarks.md"
    page.write_text(original)
    for _ in range(2):  # the second report replaces the section the first wrote
        bench_per_call.report(out, page)
        text = page.read_text()
        assert text.count(bench_per_call.BEGIN) == 1 and text.count(bench_per_call.END) == 1
        assert bench_per_call.section(doc) in text
    head, rest = text.split(bench_per_call.BEGIN)
    outside = head + rest.split(bench_per_call.END)[1]
    if bench_per_call.BEGIN in original:
        o_head, o_rest = original.split(bench_per_call.BEGIN)
        assert outside == o_head + o_rest.split(bench_per_call.END)[1]
    else:
        assert outside.rstrip("\n") == original.rstrip("\n")


def test_per_call_benchmark_section_is_generated(benchmarks_on_path) -> None:
    """The per-call table in the docs comes from the committed JSON of a full (not ``--quick``) run."""
    if not PER_CALL.exists():
        pytest.skip("no per-call benchmark committed under benchmarks/results/")
    import bench_per_call

    doc = json.loads(PER_CALL.read_text())
    assert not doc["settings"]["quick"], "benchmarks/results/per_call_cpu.json is from a --quick run"
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert bench_per_call.section(doc) in page, (
        "docs/benchmarks.md is out of date: run `python benchmarks/bench_per_call.py --report`")


def test_cost_table_is_the_committed_measurement(benchmarks_on_path) -> None:
    """``auto``'s cost table (rnn_functional/backends/costs.py) is what ``bench_costs.py --write`` made of the
    committed results/costs_cpu.json: never edited by hand, every cell and mode, every kernel a route reads."""
    import bench_costs

    from rnn_functional.backends import costs

    measured = json.loads((BENCHMARKS / "results" / "costs_cpu.json").read_text())["table_us"]
    as_tuples = {int(threads): {cell: {mode: {k: (call, tuple(tuple(p) for p in points)) for k, (call, points) in
                                              kernels.items()} for mode, kernels in modes.items()}
                                for cell, modes in cells.items()} for threads, cells in measured.items()}
    assert costs.COSTS == as_tuples, "rnn_functional/backends/costs.py is stale: run bench_costs.py --refit"
    assert set(costs.COSTS) == {1, 2}
    for cells in costs.COSTS.values():
        assert set(cells) == set(bench_costs.CELLS) and costs.FALLBACK in cells
        for cell, modes in cells.items():
            assert set(modes) == {"fwd", "fwd+bwd"}
            kernels = {"reference", "scan", "move"} | (
                {"pad", "packed", "packed_fill", "buckets"} if cell != "norm_gru" else set())
            for table in modes.values():
                assert set(table) == kernels
                for call, points in table.values():
                    assert call >= 0 and all(r1 > r0 for (r0, _), (r1, _) in zip(points, points[1:]))


def test_block_gru_benchmark_section_is_generated(benchmarks_on_path) -> None:
    """The block-GRU speed table of docs/model_based.md comes from the committed JSON, and every row's speedup is
    TorchRL's best time over ours, as measured."""
    results = BENCHMARKS / "results" / "block_gru_cpu.json"
    if not results.exists():
        pytest.skip("no block GRU benchmark committed under benchmarks/results/")
    import bench_block_gru

    doc = json.loads(results.read_text())
    for row in doc["rows"]:
        _, base_a, base_b, ours = bench_block_gru.WORKLOADS[row["workload"]]
        best = min(row["ms"][b] for b in (base_a, base_b) if b is not None)
        assert row["speedup"] == round(best / row["ms"][ours], 2)
        assert row["met"] == (best / row["ms"][ours] >= bench_block_gru.TARGET)
    page = (ROOT / "docs" / "model_based.md").read_text()
    assert bench_block_gru.section(doc) in page, (
        "docs/model_based.md is out of date: run `python benchmarks/bench_block_gru.py --report`")


def test_linear_benchmark_section_is_generated(benchmarks_on_path) -> None:
    """The minGRU/RG-LRU speed table of docs/linear_recurrences.md comes from the committed JSON, every ratio is the
    measured times' ratio, and every configuration the issue asks for was measured."""
    results = BENCHMARKS / "results" / "linear_cpu.json"
    if not results.exists():
        pytest.skip("no linear-recurrence benchmark committed under benchmarks/results/")
    import bench_linear

    doc = json.loads(results.read_text())
    for row in doc["rows"]:
        assert row["vs_scan"] == round(row["ms"]["scan"] / row["ms"]["parallel"], 2)
        assert row["vs_nn_gru"] == round(row["ms"]["nn.GRU (no resets)"] / row["ms"]["parallel"], 2)
        assert all(row["peak_mib"][name] > 0 for name in row["ms"])
    seen = {(r["cell"], r["shape"], r["mode"], r["threads"]) for r in doc["rows"]}
    assert seen == {(c, s, m, n) for c in bench_linear.CELLS for s, shape in bench_linear.SHAPES.items()
                    for m in ("eager", "compiled") for n in (1, 2) if m == "eager" or shape[1] <= bench_linear.COMPILED_MAX_T}
    page = (ROOT / "docs" / "linear_recurrences.md").read_text()
    assert bench_linear.section(doc) in page, (
        "docs/linear_recurrences.md is out of date: run `python benchmarks/bench_linear.py --report`")


def test_linear_floor_section_is_generated(benchmarks_on_path) -> None:
    """The ceiling table of docs/linear_recurrences.md comes from the committed JSON, and every ratio is the measured
    times' ratio."""
    results = BENCHMARKS / "results" / "linear_floor_cpu.json"
    if not results.exists():
        pytest.skip("no linear-recurrence floor benchmark committed under benchmarks/results/")
    import bench_linear_floor

    doc = json.loads(results.read_text())
    assert {(r["cell"], r["threads"]) for r in doc["rows"]} == {(c, n) for c in bench_linear_floor.CELLS for n in (1, 2)}
    for row in doc["rows"]:
        ms = row["ms"]
        assert row["parallel_vs_scan"] == round(ms["scan"] / ms["parallel"], 2)
        assert row["ceiling_any"] == round(ms["scan"] / ms["projection"], 2)
        assert row["ceiling_free_scan"] == round(ms["scan"] / ms["projection + coefficients"], 2)
    page = (ROOT / "docs" / "linear_recurrences.md").read_text()
    assert bench_linear_floor.section(doc) in page, (
        "docs/linear_recurrences.md is out of date: run `python benchmarks/bench_linear_floor.py --report`")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_floor_inline_checks_compute_our_step(benchmarks_on_path, cell) -> None:
    """The floor's ``inline checks`` contender computes the step ours computes, bit for bit: a floor of the same work.
    It has no grad-mode path (it is timed under ``no_grad``), and says so rather than skip what ours would do."""
    import bench_step_floor

    calls = bench_step_floor.contenders(cell)
    with torch.no_grad():
        y, carry = calls["inline checks"]()
        want_y, want_state = calls["ours"]()
    torch.testing.assert_close((y, carry), (want_y, want_state if cell == "lstm" else (want_state,)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="timed under no_grad"):
        calls["inline checks"]()


def test_step_floor_section_is_generated(benchmarks_on_path) -> None:
    """The floor table of docs/benchmarks.md comes from the committed JSON, every ratio the measured times' ratio."""
    results = BENCHMARKS / "results" / "step_floor_cpu.json"
    if not results.exists():
        pytest.skip("no step floor benchmark committed under benchmarks/results/")
    import bench_step_floor

    doc = json.loads(results.read_text())
    assert {(r["cell"], r["threads"]) for r in doc["rows"]} == {(c, n) for c in bench_step_floor.CELLS for n in (1, 2)}
    for row in doc["rows"]:
        us = row["us"]
        assert row["ratio"] == {n: round(us[n] / us["nn cell"], 3) for n in bench_step_floor.NAMES[1:]}
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert bench_step_floor.section(doc) in page, (
        "docs/benchmarks.md is out of date: run `python benchmarks/bench_step_floor.py --report`")


def test_block_gru_sequence_floor_runs_the_cells_products(benchmarks_on_path) -> None:
    """The block GRU's sequence floor multiplies exactly what the cell multiplies (the same FLOPs as our module's
    forward), only without the elementwise work between the products."""
    import bench_block_gru

    b, t, f, nb = 3, 5, 8, 2
    _, ours = bench_block_gru._pair(dict(B=b, T=t, F=f, nb=nb))
    x = torch.randn(b, t, f)
    counted = []
    for run in (lambda: ours(x), lambda: bench_block_gru.sequence_products(dict(ours.cell.named_parameters()), x, nb)):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            run()
        counted.append(counter.get_total_flops())
    per_step = 2 * b * f * f * 2 + 2 * b * f * (f // nb) * 4  # hidden linear and its dynamics part; own block, gates
    assert counted == [2 * b * t * f * f * 2 + t * per_step] * 2  # + input linear and its dynamics part, every step
