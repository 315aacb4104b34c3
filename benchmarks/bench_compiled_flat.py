"""Compiled flat SliceSampler batches: ``torch.compile`` with ``recurrent_slice_len`` against eager ``auto``.

    python benchmarks/bench_compiled_flat.py [--threads N] [--repeats R] [--quick]

Recurrent mode, CPU, H=128, F=64, one layer, forward+backward (``(y * w).sum().backward()``).
A flat ``[N]`` TensorDict of ``N / L`` whole slices of ``L`` steps, ``is_init`` True at every
slice start, stored hidden states in the TensorDict (what ``SliceSampler(slice_len=L,
strict_length=True)`` returns from collected data); cases (N, L) = (1024, 64) and (200, 20),
LSTM and GRU. Contenders, interleaved in one process on the same weights and batch
(``_timing.interleaved``):

* ``eager auto``: ``LSTMModule``/``GRUModule`` (``recurrent_backend="auto"``), no hint: the
  eager segment-aware path (the slices packed into one ATen call);
* ``eager auto + slice_len``: the same with ``recurrent_slice_len=L`` (a rectangular batch);
* ``compiled + slice_len``: ``torch.compile(module, fullgraph=True)`` (Inductor) with
  ``recurrent_slice_len=L``: ``[N / L, L]`` through ``scan``;
* ``compiled + slice_len, cpp_wrapper``: the same with Inductor's ``cpp_wrapper`` option (the
  compiled graph's host code in C++ instead of Python: less per-step overhead in ``scan``'s
  loop, a longer compile);
* ``compiled, no hint``: the same module compiled without the hint: one row of ``N`` steps.

Writes ``results/compiled_flat_cpu.json`` and prints a Markdown table with each contender's
ratio to ``eager auto``. Compile time is the first call (``first_call_s``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
F_IN, HIDDEN = 64, 128
CASES = [(1024, 64), (200, 20)]  # (N, slice_len)


def flat_batch(cell: str, n: int, slice_len: int, g: torch.Generator) -> TensorDict:
    """A flat ``[n]`` batch of whole slices: input, stored hidden, ``is_init`` True at slice starts."""
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[::slice_len] = True
    data = {"x": torch.randn(n, F_IN, generator=g), "is_init": is_init}
    keys = ("h", "c") if cell == "lstm" else ("h",)
    for k in keys:
        data[k] = torch.randn(n, 1, HIDDEN, generator=g) * 0.1
    return TensorDict(data, [n])


def make_module(cell: str, slice_len: int | None, seed: int = 0):
    torch.manual_seed(seed)
    if cell == "lstm":
        return rf.LSTMModule(F_IN, HIDDEN, in_keys=["x", "h", "c"], out_keys=["y", ("next", "h"), ("next", "c")],
                             recurrent_slice_len=slice_len)
    return rf.GRUModule(F_IN, HIDDEN, in_keys=["x", "h"], out_keys=["y", ("next", "h")], recurrent_slice_len=slice_len)


def fwd_bwd(module, td: TensorDict, weights: torch.Tensor):
    """One forward+backward over the batch (a fresh shallow TensorDict: outputs are written into it)."""
    def call():
        with rf.set_recurrent_mode(True):
            out = module(td.copy())
        (out["y"] * weights).sum().backward()
    return call


def run_case(cell: str, n: int, slice_len: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(n + slice_len)
    td = flat_batch(cell, n, slice_len, g)
    weights = torch.randn(n, HIDDEN, generator=g)
    eager = make_module(cell, None)
    eager_hint = make_module(cell, slice_len)
    compiled_hint = torch.compile(make_module(cell, slice_len), fullgraph=True)
    compiled_cpp = torch.compile(make_module(cell, slice_len), fullgraph=True, options={"cpp_wrapper": True})
    compiled_plain = torch.compile(make_module(cell, None), fullgraph=True)
    contenders = {
        "eager auto": fwd_bwd(eager, td, weights),
        "eager auto + slice_len": fwd_bwd(eager_hint, td, weights),
        "compiled + slice_len": fwd_bwd(compiled_hint, td, weights),
        "compiled + slice_len, cpp_wrapper": fwd_bwd(compiled_cpp, td, weights),
        "compiled, no hint": fwd_bwd(compiled_plain, td, weights),
    }
    timing = interleaved(contenders, torch.device("cpu"), warmup=2, repeats=repeats, max_seconds=15.0)
    base = timing["eager auto"]["median_s"]
    for r in timing.values():
        if "median_s" in r:
            r["ratio_to_eager_auto"] = r["median_s"] / base
    return {"cell": cell, "n": n, "slice_len": slice_len, "mode": "fwd+bwd", "timing": timing}


def table(rows: list[dict]) -> str:
    names = list(rows[0]["timing"])
    lines = ["| cell | N | slice_len | " + " | ".join(names) + " |", "|---" * (3 + len(names)) + "|"]
    for row in rows:
        cells = []
        for name in names:
            r = row["timing"][name]
            cells.append(r.get("error", "")[:40] if "error" in r
                         else f"{r['median_s'] * 1e3:.1f} ms ({r['ratio_to_eager_auto']:.2f}x)")
        lines.append(f"| {row['cell']} | {row['n']} | {row['slice_len']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="one case (LSTM, N=200), 3 repeats; no JSON written")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = [("lstm", 200, 20)] if args.quick else [(c, n, s) for c in ("lstm", "gru") for n, s in CASES]
    rows = []
    for cell, n, s in cases:
        rows.append(run_case(cell, n, s, 3 if args.quick else args.repeats))
        print(table(rows[-1:]), flush=True)
    print(table(rows))
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        out = {"environment": environment(torch.device("cpu")), "hidden": HIDDEN, "input": F_IN, "results": rows}
        (RESULTS / "compiled_flat_cpu.json").write_text(json.dumps(out, indent=1))
        print(f"wrote {RESULTS / 'compiled_flat_cpu.json'}")


if __name__ == "__main__":
    main()
