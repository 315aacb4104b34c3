"""The cost table ``auto`` reads (``rnn_functional/backends/costs.py``), measured here.

    python benchmarks/bench_costs.py [--threads N] [--repeats R] [--quick] [--write] [--out PATH]

For every cell (LSTM, GRU, layer-norm GRU) and mode (``fwd`` under ``torch.no_grad``; ``fwd+bwd``:
forward and ``y.sum().backward()``), each way of running a call is timed through the public functions
(one layer, H=128, F=64; the fastest of the rounds), interleaved in random order, at ``rows`` rows and ``T`` in {1, 32} steps:

* ``reference``, ``scan``, ``pad``: reset-free calls ``[rows, T]`` (``backend=...``);
* ``packed``: ``backend="pad", segment_layout="packed"`` on one flat row of ``rows`` slices of ``T``
  steps (every step runs ``rows`` rows), less the gathers' measured cost;
* ``move``: the gathers a re-batched layout adds (an ``index_copy`` of the inputs into a block and an
  ``index_select`` of the outputs back, with their backward in ``fwd+bwd``) of ``rows`` row-steps.

A kernel's step cost at ``rows`` rows is ``(t(32) - t(1)) / 31``, its call cost the median over the
row counts of ``t(1) - step``; ``packed`` is stored as its extra over ``pad`` (clipped at zero).
Writes ``results/costs_cpu.json`` (the times and the table); ``--write`` also rewrites the table block of ``rnn_functional/backends/costs.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

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
ROWS, QUICK_ROWS = (2, 8, 64, 512), (2, 16)
SHORT, LONG = 1, 32
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


def measure(cell: str, grad: bool, rows: tuple, repeats: int) -> dict:
    """``{kernel: {rows: {T: seconds}}}`` for ``cell`` in one mode."""
    init, sequence = CELLS[cell]
    params = init(F_IN, HIDDEN)
    if grad:
        params = params.apply(lambda t: t.detach().requires_grad_(True))
    kernels = ["reference", "scan"] + (["pad", "packed"] if cell != "norm_gru" else [])
    contenders = {}
    for n in rows:
        for t_len in (SHORT, LONG):
            x = torch.randn(n, t_len, F_IN)
            for k in kernels:
                if k == "packed":
                    is_init = torch.zeros(1, n * t_len, dtype=torch.bool)
                    is_init[0, ::t_len] = True
                    fn = (lambda xx, m=is_init: sequence(xx, None, params, is_init=m, backend="pad",
                                                         segment_layout="packed"))
                    contenders[k, n, t_len] = _timed(fn, x.reshape(1, n * t_len, F_IN), grad)
                else:
                    contenders[k, n, t_len] = _timed(lambda xx, k=k: sequence(xx, None, params, backend=k), x, grad)
            contenders["move", n, t_len] = _move(n * t_len, grad)
    times = interleaved({repr(key): fn for key, fn in contenders.items()}, CPU, repeats=repeats, shuffle=True)
    out: dict = {}
    for key in contenders:
        k, n, t_len = key
        out.setdefault(k, {}).setdefault(n, {})[t_len] = times[repr(key)]["min_s"]  # noise only adds time
    return out


def table_row(times: dict) -> dict:
    """``kernel -> (call, ((rows, step), ...))`` in microseconds from the times of :func:`measure`."""
    row = {}
    for k, by_rows in times.items():
        if k == "move":  # one gather of rows x T row-steps: a point per row-step count
            points = sorted({(n * t, us * 1e6) for n, ts in by_rows.items() for t, us in ts.items()})
            row[k] = (0.0, tuple((r, round(t, 3)) for r, t in points))
            continue
        steps, calls = [], []
        for n, ts in sorted(by_rows.items()):
            t_short, t_long = ts[SHORT], ts[LONG]
            if k == "packed":  # its gathers are timed apart
                t_short, t_long = t_short - times["move"][n][SHORT], t_long - times["move"][n][LONG]
            step = max((t_long - t_short) / (LONG - SHORT), 0.0)
            steps.append((n, round(step * 1e6, 3)))
            calls.append(max(t_short - SHORT * step, 0.0) * 1e6)
        row[k] = (round(statistics.median(calls), 3), tuple(steps))
    if "packed" in row:  # the table holds packed's extra over pad's kernel at the same rows (never negative)
        (call, steps), (pad_call, pad_steps) = row["packed"], row["pad"]
        row["packed"] = (round(max(call - pad_call, 0.0), 3),
                         tuple((n, round(max(s - p, 0.0), 3)) for (n, s), (_, p) in zip(steps, pad_steps)))
    return row


def write_table(table: dict, measured_on: str) -> None:
    lines = ["# BEGIN COSTS (generated by benchmarks/bench_costs.py; do not edit by hand)",
             f"MEASURED_ON = {measured_on!r}", "COSTS = {"]
    for cell, modes in table.items():
        lines.append(f"    {cell!r}: {{")
        for mode, kernels in modes.items():
            lines.append(f"        {mode!r}: {{")
            lines += [f"            {k!r}: {(call, points)!r}," for k, (call, points) in kernels.items()]
            lines.append("        },")
        lines.append("    },")
    lines += ["}", "# END COSTS"]
    text = COSTS_PY.read_text()
    COSTS_PY.write_text(re.sub(r"# BEGIN COSTS.*?# END COSTS", lambda _: "\n".join(lines), text, flags=re.S))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="two row counts, three repeats (a smoke run)")
    ap.add_argument("--write", action="store_true", help="rewrite the table block of rnn_functional/backends/costs.py")
    ap.add_argument("--out", type=Path, default=RESULTS / "costs_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows, repeats = (QUICK_ROWS, 3) if args.quick else (ROWS, args.repeats)
    table, times = {}, {}
    for cell in CELLS:
        table[cell], times[cell] = {}, {}
        for mode in ("fwd", "fwd+bwd"):
            times[cell][mode] = measure(cell, mode == "fwd+bwd", rows, repeats)
            table[cell][mode] = table_row(times[cell][mode])
            print(cell, mode, table[cell][mode], flush=True)
    env = environment(CPU)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": env, "hidden": HIDDEN, "input": F_IN, "steps": [SHORT, LONG],
                                    "times_s": times, "table_us": table}, indent=1))
    if args.write:
        write_table(table, f"{env['device_name']}, {args.threads} threads, torch {torch.__version__}")


if __name__ == "__main__":
    main()
