"""The benchmarks' harness and command line: interleaved timing, the row format a suite writes, the budget cut, the
README's table generated from the committed results, and a suite's first row run for real on tiny work."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as cli
from benchmarks import _timing, common, flat, linear, sequences

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {"case", "ms", "min_ms", "first_call_s", "errors"}


@pytest.mark.parametrize("settle", [False, True])
def test_interleaved_settle_calls_each_contender_once_more_before_each_timed_call(settle) -> None:
    log: list[str] = []
    contenders = {name: (lambda name=name: log.append(name)) for name in ("a", "b")}
    results = _timing.interleaved(contenders, torch.device("cpu"), warmup=1, repeats=3, settle=settle)
    assert [results[n]["samples"] for n in "ab"] == [3, 3]
    assert [log.count(n) for n in "ab"] == ([1 + 2 * 3] * 2 if settle else [1 + 3] * 2)
    timed = log[2:]  # after one warm-up call each
    if settle:  # every call is paired with the next one of the same contender: untimed, then timed
        assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))


def test_row_records_times_and_errors_and_memory() -> None:
    def fails():
        raise ValueError("cannot serve this case")

    x = torch.randn(512, 512)
    r = common.row({"what": "tiny"}, {"mm": lambda: x @ x, "bad": fails}, torch.device("cpu"), memory=True,
                   warmup=1, repeats=3)
    assert ROW_KEYS | {"peak_mib"} <= r.keys() and r["case"] == {"what": "tiny"}
    assert set(r["ms"]) == {"mm"} and 0 < r["min_ms"]["mm"] <= r["ms"]["mm"]
    assert r["errors"] == {"bad": "ValueError: cannot serve this case"}
    assert r["peak_mib"]["mm"] == pytest.approx(1.0, rel=0.01)  # the product's output, 512 * 512 * 4 bytes


def test_agree_refuses_outputs_that_differ() -> None:
    a = torch.zeros(3)
    common.agree(a, a + 1e-6)
    with pytest.raises(AssertionError):
        common.agree(a, a + 1e-2)


def test_a_budget_of_zero_writes_an_empty_incomplete_result(tmp_path) -> None:
    out = tmp_path / "linear.json"
    cli.main(["linear", "--quick", "--budget-s", "0", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["suite"] == "linear" and doc["rows"] == [] and doc["complete"] is False
    assert {"device_name", "torch", "torchrl", "date"} <= doc["environment"].keys()


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(device=torch.device("cpu"), quick=True, dtype="float32", rl=None, **kw)


@pytest.mark.parametrize("suite", [linear, sequences, flat], ids=["linear", "sequences", "flat"])
def test_a_suites_first_row_runs_every_contender(suite, monkeypatch) -> None:
    """The first row of a suite's ``--quick`` run (the timing cut to one round): every contender runs, ours and a
    baseline among them, and our output agreed with TorchRL's before timing (``common.agree``)."""
    real_row = common.row
    monkeypatch.setattr(suite, "row", lambda case, fns, device, **kw: real_row(
        case, fns, device, **{**kw, "warmup": 1, "repeats": 1, "memory": False}))
    r = next(suite.rows(_args()))
    assert ROW_KEYS <= r.keys() and r["errors"] == {}, r["errors"]
    assert suite.OURS in r["ms"] and any(b in r["ms"] for b in suite.BASELINES)


def test_readme_table_is_the_committed_results() -> None:
    """The README's headline table is what ``python -m benchmarks table`` makes of the committed JSON files."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split(cli.BEGIN, 1)[1].split(cli.END, 1)[0]
    assert block.strip() == cli.table().strip(), "README.md's table is stale: run `python -m benchmarks table`"
    assert block.count("\n| ") >= 4


def test_plot_draws_one_png_per_suite_result(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    cli.plot(assets=tmp_path)
    drawn = {p.stem for p in tmp_path.glob("*.png")}
    docs = {p.stem: json.loads(p.read_text()) for p in cli.RESULTS.glob("*.json")}
    results = {name for name, doc in docs.items() if isinstance(doc, dict) and doc.get("suite") in cli.SUITES}
    assert drawn == results and results
