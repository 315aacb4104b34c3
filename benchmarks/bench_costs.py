"""The cost table ``auto`` reads (``rnn_functional/backends/costs.py``), measured here.

    python benchmarks/bench_costs.py [--threads 1 2] [--repeats R] [--quick] [--write] [--out PATH]
    python benchmarks/bench_costs.py --refit      (the table again from the times in --out, no timing)

At 1 and 2 threads (``torch.set_num_threads``: oneDNN's LSTM gains from threads more than ATen's
per-step loops, so the ranking of routes moves with them), for every cell (LSTM, GRU, layer-norm GRU) and mode (``fwd`` under ``torch.no_grad``; ``fwd+bwd``:
forward and ``y.sum().backward()``), each way of running a call is timed through the public functions
(one layer, H=128, F=64; the fastest of the rounds), interleaved in random order, at ``rows`` rows (2 to 16384:
a re-batched call of a densely reset batch runs thousands of segments per step, and a step's cost per row grows
once its tensors leave the caches, so the large counts are measured, not extrapolated) and ``T`` in {1, 32} steps
({1, 8} above 512 rows):

* ``pad``: reset-free calls ``[rows, T]``; ``reference``, ``scan``: the same with a reset every 4 steps
  (the loops apply a mask at every step of a call with resets, as their routes run them);
* ``packed`` and ``buckets``: ``backend="pad", segment_layout="packed"`` (``"buckets"``: one bucket) on
  one flat row of ``rows`` slices of ``T`` steps (every step runs ``rows`` rows), less the gathers'
  measured cost: their call cost is the layout's own work (plan, sort, cut, indices) and one kernel call
  (``buckets`` up to 512 rows only: its steps are ``pad``'s);
* ``move``: the gathers a re-batched layout adds (an ``index_copy`` of the inputs into a block and an
  ``index_select`` of the outputs back, with their backward in ``fwd+bwd``) of ``rows`` row-steps.

A kernel's step cost at ``rows`` rows is the slope of its times over ``T``, its call cost the median over the
row counts up to 512 of ``t(1) - step``. ``packed`` is timed at ``T = 8`` too (up to 512 rows): its backward zero-fills its whole
input gradient at every step, a cost ``fill * steps * (rows * T)`` (``packed_fill``) that the three times
separate from its call and step costs. ``packed`` is timed on ragged slices (the first ``T + 1`` steps long,
the last ``T - 1``): ATen's packed backward is several times faster when every step runs the same rows, a
case the slices' view serves, and several times slower otherwise (``[32, 64]``, LSTM fwd+bwd: 12 ms with
equal segments, 63 ms with one extra reset), the case packed is chosen for.
Writes ``results/costs_cpu.json`` (the times and the table); ``--write`` also rewrites the table block of ``rnn_functional/backends/costs.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rnn_functional, not an installed one
from _timing import environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COSTS_PY = Path(__file__).resolve().parents[1] / "rnn_functional" / "backends" / "costs.py"
F_IN, HIDDEN = 64, 128
CELLS = {"lstm": (rf.init_lstm_params, rf.lstm_sequence), "gru": (rf.init_gru_params, rf.gru_sequence),
         "norm_gru": (rf.init_norm_gru_params, rf.norm_gru_sequence)}
ROWS, QUICK_ROWS = (2, 8, 32, 64, 128, 256, 512, 1024, 4096, 16384), (2, 16)
MANY = 512  # above it a call's time grows with rows x steps: fewer steps keep the run to minutes
PACKED_MID = 8  # packed is timed at three step counts up to MANY rows: they solve its backward's fill (see above)


def step_counts(kernel: str, rows: int) -> tuple[int, ...]:
    """The step counts ``kernel`` is timed at over ``rows`` rows."""
    if rows > MANY:
        return (1, 8)
    return (1, PACKED_MID, 32) if kernel == "packed" else (1, 32)


CPU = torch.device("cpu")


def _timed(fn, x, grad: bool):
    """One call: ``fn(x)`` under no_grad, or forward and ``y.sum().backward()``."""
    if not grad:
        def run():
            with torch.no_grad():
                fn(x)
        return run
    leaf = x.detach().requires_grad_(True)
    return lambda: fn(leaf)[0].sum().backward()


def _move(row_steps: int, grad: bool):
    x = torch.randn(row_steps, F_IN, requires_grad=grad)
    y = torch.randn(row_steps, HIDDEN, requires_grad=grad)
    dest = torch.randperm(row_steps)

    def run():
        with torch.set_grad_enabled(grad):
            block = x.new_zeros(row_steps, F_IN).index_copy(0, dest, x)
            back = y.index_select(0, dest)
            if grad:
                (block.sum() + back.sum()).backward()
    return run


def _kernel_call(sequence, params, kernel: str, x: torch.Tensor, grad: bool):
    """One call of ``kernel`` over ``x [n, T, F]`` as :func:`measure` times it."""
    n, t_len = x.shape[:2]
    if kernel in ("packed", "buckets"):  # one flat row of n slices: every step runs n rows
        is_init = torch.zeros(1, n * t_len, dtype=torch.bool)
        is_init[0, ::t_len] = True
        if kernel == "packed":  # ragged, as packed runs (equal lengths take ATen's much faster path)
            is_init[0, t_len] = False
            is_init[0, min(t_len + 1, n * t_len - 1)] = True
        return _timed(lambda xx: sequence(xx, None, params, is_init=is_init, backend="pad", segment_layout=kernel),
                      x.reshape(1, n * t_len, F_IN), grad)
    if kernel == "pad":
        return _timed(lambda xx: sequence(xx, None, params, backend="pad"), x, grad)
    resets = torch.zeros(n, t_len, dtype=torch.bool)  # the loops as routes run them: a reset mask read at every step
    resets[:, ::4] = True
    return _timed(lambda xx: sequence(xx, None, params, is_init=resets, backend=kernel), x, grad)


def measure(cell: str, grad: bool, rows: tuple, repeats: int) -> dict:
    """``{kernel: {rows: {T: seconds}}}`` for ``cell`` in one mode."""
    init, sequence = CELLS[cell]
    params = init(F_IN, HIDDEN)
    if grad:
        params = params.apply(lambda t: t.detach().requires_grad_(True))
    kernels = ["reference", "scan"] + (["pad", "packed", "buckets"] if cell != "norm_gru" else [])
    out: dict = {}
    for group in ([n for n in rows if n <= MANY], [n for n in rows if n > MANY]):  # apart: a call over thousands
        contenders = {}  # of rows leaves the heap and caches to the next call, which a few rows' call would pay for
        for n in group:
            for k in kernels if n <= MANY else [k for k in kernels if k != "buckets"]:  # buckets: its call cost only
                for t_len in step_counts(k, n):
                    x = torch.randn(n, t_len, F_IN)
                    contenders[k, n, t_len] = _kernel_call(sequence, params, k, x, grad)
                    contenders["move", n, t_len] = _move(n * t_len, grad)
        times = interleaved({repr(key): fn for key, fn in contenders.items()}, CPU, repeats=repeats, shuffle=True)
        for key in contenders:
            k, n, t_len = key
            out.setdefault(k, {}).setdefault(n, {})[t_len] = times[repr(key)]["min_s"]  # noise only adds time
    return out


def table_row(times: dict) -> dict:
    """``kernel -> (call, ((rows, step), ...))`` in microseconds from the times of :func:`measure`."""
    row = {}
    for k, by_rows in times.items():
        if k == "move":  # one gather of rows x T row-steps: a point per row-step count (the cheaper of equal ones)
            points: dict[int, float] = {}
            for n, ts in by_rows.items():
                for t, seconds in ts.items():
                    points[n * t] = min(points.get(n * t, seconds), seconds)
            row[k] = (0.0, tuple((r, round(points[r] * 1e6, 3)) for r in sorted(points)))
            continue
        if k in ("packed", "buckets"):  # their gathers are timed apart
            by_rows = {n: {t: sec - times["move"][n][t] for t, sec in ts.items()} for n, ts in by_rows.items()}
        fill = 0.0
        longest = 1 if k == "packed" else 0  # packed's longest segment: T + 1 steps (ragged, see measure)
        if k == "packed":  # call + (T+1) * step + fill * (T+1) * (n * T): three times per n solve it; one fill for all
            fills = []
            for n, ts in by_rows.items():
                if n > MANY:  # two step counts there (the fill is per element, solved where three were timed)
                    continue
                t_len = np.array(sorted(ts), dtype=float)
                solved = np.linalg.solve(np.stack([np.ones(3), t_len + 1, n * t_len * (t_len + 1)], 1),
                                         [ts[t] for t in sorted(ts)])
                fills.append(max(float(solved[2]), 0.0))
            fill = statistics.median(fills)
            row["packed_fill"] = (round(fill * 1e6, 6), ())
        steps, calls = [], []
        for n, ts in sorted(by_rows.items()):  # call + steps * step through the times less the fill
            t_len = np.array(sorted(ts), dtype=float)
            step, call = np.polyfit(t_len + longest, [ts[t] - fill * n * t * (t + longest) for t in sorted(ts)], 1)
            steps.append((n, round(max(float(step), 0.0) * 1e6, 3)))
            if n <= MANY:  # a fixed cost: the intercept of a call over thousands of rows is mostly their noise
                calls.append(max(float(call), 0.0) * 1e6)
        row[k] = (round(statistics.median(calls), 3), tuple(steps))
    return row


def write_table(table: dict, measured_on: str) -> None:
    """The ``COSTS`` block of ``costs.py``: ``{threads: {cell: {mode: {kernel: (call, points)}}}}``."""
    lines = ["# BEGIN COSTS (generated by benchmarks/bench_costs.py; do not edit by hand)",
             f"MEASURED_ON = {measured_on!r}", "COSTS = {"]
    for threads, cells in table.items():
        lines.append(f"    {int(threads)}: {{")
        for cell, modes in cells.items():
            lines.append(f"        {cell!r}: {{")
            for mode, kernels in modes.items():
                lines.append(f"            {mode!r}: {{")
                lines += [f"                {k!r}: {(call, tuple(map(tuple, points)))!r}," for k, (call, points) in kernels.items()]
                lines.append("            },")
            lines.append("        },")
        lines.append("    },")
    lines += ["}", "# END COSTS"]
    text = COSTS_PY.read_text()
    COSTS_PY.write_text(re.sub(r"# BEGIN COSTS.*?# END COSTS", lambda _: "\n".join(lines), text, flags=re.S))


def _ints(times: dict) -> dict:
    """JSON's string keys of row counts and step counts back to ints."""
    return {k: {int(n): {int(t): sec for t, sec in ts.items()} for n, ts in by_rows.items()} for k, by_rows in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="two row counts, three repeats (a smoke run)")
    ap.add_argument("--write", action="store_true", help="rewrite the table block of rnn_functional/backends/costs.py")
    ap.add_argument("--out", type=Path, default=RESULTS / "costs_cpu.json")
    ap.add_argument("--refit", action="store_true", help="rebuild the table from the times in --out (no timing)")
    args = ap.parse_args()
    env = environment(CPU)
    if args.refit:
        saved = json.loads(args.out.read_text())
        times = {int(th): {cell: {mode: _ints(t) for mode, t in modes.items()} for cell, modes in cells.items()}
                 for th, cells in saved["times_s"].items()}
        env = saved["environment"]
    else:
        torch.manual_seed(0)
        rows, repeats = (QUICK_ROWS, 3) if args.quick else (ROWS, args.repeats)
        times = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            times[threads] = {cell: {mode: measure(cell, mode == "fwd+bwd", rows, repeats) for mode in ("fwd", "fwd+bwd")}
                              for cell in CELLS}
            print(f"{threads} threads measured", flush=True)
    table = {th: {cell: {mode: table_row(t) for mode, t in modes.items()} for cell, modes in cells.items()}
             for th, cells in times.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    steps = {f"rows <= {MANY}": step_counts("pad", MANY), f"packed, rows <= {MANY}": step_counts("packed", MANY),
             f"rows > {MANY}": step_counts("pad", MANY + 1)}
    args.out.write_text(json.dumps({"environment": env, "hidden": HIDDEN, "input": F_IN, "steps": steps,
                                    "times_s": times, "table_us": table}, indent=1))
    if args.write or args.refit:
        write_table(table, f"{env['device_name']}, torch {env['torch']}")


if __name__ == "__main__":
    main()
