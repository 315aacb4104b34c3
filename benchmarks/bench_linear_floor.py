"""How fast can ``parallel`` get on this machine? The work any parallel-in-time solver must do, timed beside ``scan``.

Issue 30 asks ``parallel`` for 5x over the same cell's ``scan`` at B=32, T=1024 (fwd+bwd, F=64, H=128, 5% resets).
Both backends project the input once for the whole sequence (one GEMM, two more in the backward). ``parallel`` then
computes the recurrence's coefficients ``(a, b)`` for every step (elementwise) and folds the resets in; only then
does it scan. Timed side by side in one process, eager, 1 and 2 threads:

* ``scan``, ``parallel``: ``{min_gru,rglru}_sequence`` as shipped;
* ``projection``: the input GEMM alone, forward and backward (both backends do it): a floor for any solver;
* ``projection + coefficients``: what ``parallel`` computes before its scan, forward and backward (PyTorch ops).

``scan / projection`` bounds the ratio any implementation could reach; ``scan / (projection + coefficients)``
the ratio a free scan would give ``parallel``'s coefficient code. Writes ``results/linear_floor_cpu.json``;
``--report`` writes its table in ``docs/linear_recurrences.md``.

    python benchmarks/bench_linear_floor.py && python benchmarks/bench_linear_floor.py --report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, section_main  # noqa: E402
from bench_linear import CELLS, PAGE, ROOT, _inputs  # noqa: E402

from rnn_functional.cells.min_gru import MIN_GRU  # noqa: E402
from rnn_functional.cells.rglru import RGLRU  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "linear_floor_cpu.json"
BEGIN, END = "<!-- BEGIN GENERATED: bench_linear_floor -->", "<!-- END GENERATED: bench_linear_floor -->"
SHAPE, QUICK_SHAPE = (32, 1024, None), (4, 16, None)
CELL_OBJECTS = {"min_gru": MIN_GRU, "rglru": RGLRU}


def contenders(cell: str, shape) -> dict:
    init, sequence = CELLS[cell]
    x, is_init = _inputs(shape)
    params = init(x.shape[-1], 128).apply(lambda t: t.requires_grad_())
    tensors = dict(params.items())
    cell_object = CELL_OBJECTS[cell]
    w = cell_object.layer_weights(tensors, cell_object.read_layout(tensors), 0)
    mask = is_init.unsqueeze(-1)

    def ours(backend):
        def run():
            y, h = sequence(x, None, params, is_init=is_init, backend=backend)
            (y.sum() + h.sum()).backward()
        return run

    def projection():
        F.linear(x, w.weight_ih, w.bias_ih).sum().backward()

    def coefficients():
        a, b = cell_object.coefficients(F.linear(x, w.weight_ih, w.bias_ih), w)
        (torch.where(mask, 0.0, a).sum() + b.sum()).backward()

    return {"scan": ours("scan"), "parallel": ours("parallel"), "projection": projection,
            "projection + coefficients": coefficients}


def run(shape, threads: list[int], repeats: int) -> dict:
    rows = []
    for cell in CELLS:
        calls = contenders(cell, shape)
        for n in threads:
            torch.set_num_threads(n)
            timed = interleaved(calls, torch.device("cpu"), repeats=repeats, warmup=2, max_seconds=60, settle=True)
            ms = {name: round(r["median_s"] * 1e3, 2) for name, r in timed.items()}
            rows.append(dict(cell=cell, B=shape[0], T=shape[1], threads=n, ms=ms,
                             parallel_vs_scan=round(ms["scan"] / ms["parallel"], 2),
                             ceiling_any=round(ms["scan"] / ms["projection"], 2),
                             ceiling_free_scan=round(ms["scan"] / ms["projection + coefficients"], 2)))
            print(json.dumps(rows[-1]), flush=True)
    return {"environment": environment(torch.device("cpu")), "rows": rows}


def section(doc: dict) -> str:
    lines = ["| cell | threads | scan (ms) | parallel (ms) | projection (ms) | projection + coefficients (ms) | "
             "parallel vs scan | ceiling: scan / projection | ceiling: scan / (projection + coefficients) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        ms = r["ms"]
        lines.append(f"| {r['cell']} | {r['threads']} | {ms['scan']} | {ms['parallel']} | {ms['projection']} | "
                     f"{ms['projection + coefficients']} | {r['parallel_vs_scan']}x | {r['ceiling_any']}x | "
                     f"{r['ceiling_free_scan']}x |")
    env, r0 = doc["environment"], doc["rows"][0]
    return (f"{BEGIN}\n\n" + "\n".join(lines) + f"\n\nMeasured on {env.get('device_name', 'CPU')} "
            f"({env.get('cpu_count')} cores), torch {env.get('torch')}: eager fwd+bwd, B={r0['B']}, T={r0['T']}, F=64, "
            f"H=128, one layer, 5% resets; median of interleaved rounds. Regenerate with "
            f"`python benchmarks/bench_linear_floor.py && python benchmarks/bench_linear_floor.py --report`.\n\n{END}")


def main() -> None:
    section_main(__doc__.splitlines()[0], RESULTS, PAGE, BEGIN, END,
                 lambda quick, threads: run(QUICK_SHAPE if quick else SHAPE, threads, 3 if quick else 9), section)


if __name__ == "__main__":
    main()
