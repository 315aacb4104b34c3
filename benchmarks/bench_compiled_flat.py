"""Compiled flat SliceSampler batches: ``torch.compile`` with ``recurrent_slice_len`` against eager ``auto``.

    python benchmarks/bench_compiled_flat.py [--cells lstm gru] [--layouts strict ragged] [--threads N]
                                             [--repeats R] [--quick] [--table]

Recurrent mode, CPU, H=128, F=64, one layer, forward+backward (``(y * w).sum().backward()``).
A flat ``[N]`` TensorDict of trajectory slices, ``is_init`` True at every slice start, stored
hidden states in the TensorDict, as ``SliceSampler(slice_len=L, ...)`` returns from collected data:

* ``strict`` (``strict_length=True``): ``N / L`` whole slices of ``L`` steps, (N, L) = (1024, 64)
  and (200, 20); the modules get ``recurrent_slice_len=L``;
* ``ragged`` (``strict_length=False``): ``K`` slices truncated to lengths drawn uniformly in
  ``[L / 2, L]``, (K, L) = (16, 64) and (10, 20); the modules get ``recurrent_slice_len=L,
  recurrent_num_slices=K`` (compiled: a padded ``[K, L]`` block).

Contenders, interleaved in one process on the same weights and batch (``_timing.interleaved``):

* ``eager auto``: ``LSTMModule``/``GRUModule`` (``recurrent_backend="auto"``), no hint: the
  eager segment-aware path (the slices packed into one ATen call);
* ``eager auto + slice_len`` (strict only): the same with ``recurrent_slice_len=L`` (a
  rectangular batch);
* ``compiled + slice_len``: ``torch.compile(module, fullgraph=True)`` (Inductor) with the hint:
  ``[N / L, L]`` (strict) or the padded ``[K, L]`` block (ragged) through ``scan``;
* ``compiled + slice_len, cpp_wrapper``: the same with Inductor's ``cpp_wrapper`` option (the
  compiled graph's host code in C++ instead of Python: less per-step overhead in ``scan``'s
  loop, a longer compile);
* ``compiled, no hint`` (strict only): the module compiled without the hint: one row of ``N`` steps.

Updates ``results/compiled_flat_cpu.json`` (rows of the cases run replace the stored ones, so the
parts can run separately, each within the time a shared machine allows) and prints a Markdown table
with each contender's ratio to ``eager auto``. Compile time is the first call (``first_call_s``).
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
CASES = {"strict": [(16, 64), (10, 20)], "ragged": [(16, 64), (10, 20)]}  # (slices, slice_len)


def slice_lengths(layout: str, num_slices: int, slice_len: int, g: torch.Generator) -> list[int]:
    """Whole slices (strict) or slices truncated to lengths drawn uniformly in ``[slice_len / 2, slice_len]``."""
    if layout == "strict":
        return [slice_len] * num_slices
    return torch.randint(slice_len // 2, slice_len + 1, (num_slices,), generator=g).tolist()


def flat_batch(cell: str, lengths: list[int], g: torch.Generator) -> TensorDict:
    """A flat ``[N]`` batch of slices: input, stored hidden, ``is_init`` True at slice starts."""
    n = sum(lengths)
    is_init = torch.zeros(n, 1, dtype=torch.bool)
    is_init[torch.tensor([0] + lengths[:-1]).cumsum(0)] = True
    data = {"x": torch.randn(n, F_IN, generator=g), "is_init": is_init}
    keys = ("h", "c") if cell == "lstm" else ("h",)
    for k in keys:
        data[k] = torch.randn(n, 1, HIDDEN, generator=g) * 0.1
    return TensorDict(data, [n])


def make_module(cell: str, slice_len: int | None = None, num_slices: int | None = None, seed: int = 0):
    torch.manual_seed(seed)
    hint = dict(recurrent_slice_len=slice_len, recurrent_num_slices=num_slices)
    if cell == "lstm":
        return rf.LSTMModule(F_IN, HIDDEN, in_keys=["x", "h", "c"], out_keys=["y", ("next", "h"), ("next", "c")], **hint)
    return rf.GRUModule(F_IN, HIDDEN, in_keys=["x", "h"], out_keys=["y", ("next", "h")], **hint)


def fwd_bwd(module, td: TensorDict, weights: torch.Tensor):
    """One forward+backward over the batch (a fresh shallow TensorDict: outputs are written into it)."""
    def call():
        with rf.set_recurrent_mode(True):
            out = module(td.copy())
        (out["y"] * weights).sum().backward()
    return call


def run_case(cell: str, layout: str, num_slices: int, slice_len: int, repeats: int) -> dict:
    torch._dynamo.reset()  # every case compiles its own modules; earlier cases' graphs are not reused
    g = torch.Generator().manual_seed(num_slices + slice_len)
    lengths = slice_lengths(layout, num_slices, slice_len, g)
    td = flat_batch(cell, lengths, g)
    weights = torch.randn(td.shape[0], HIDDEN, generator=g)
    hint = (slice_len, None) if layout == "strict" else (slice_len, num_slices)
    contenders = {"eager auto": fwd_bwd(make_module(cell), td, weights)}
    if layout == "strict":
        contenders["eager auto + slice_len"] = fwd_bwd(make_module(cell, *hint), td, weights)
    contenders["compiled + slice_len"] = fwd_bwd(torch.compile(make_module(cell, *hint), fullgraph=True), td, weights)
    contenders["compiled + slice_len, cpp_wrapper"] = fwd_bwd(
        torch.compile(make_module(cell, *hint), fullgraph=True, options={"cpp_wrapper": True}), td, weights)
    if layout == "strict":
        contenders["compiled, no hint"] = fwd_bwd(torch.compile(make_module(cell), fullgraph=True), td, weights)
    timing = interleaved(contenders, torch.device("cpu"), warmup=2, repeats=repeats, max_seconds=10.0)
    base = timing["eager auto"]["median_s"]
    for r in timing.values():
        if "median_s" in r:
            r["ratio_to_eager_auto"] = r["median_s"] / base
    return {"cell": cell, "layout": layout, "n": td.shape[0], "num_slices": num_slices, "slice_len": slice_len,
            "mode": "fwd+bwd", "timing": timing}


def table(rows: list[dict]) -> str:
    names = ["eager auto", "eager auto + slice_len", "compiled + slice_len", "compiled + slice_len, cpp_wrapper",
             "compiled, no hint"]
    lines = ["| cell | layout | N | slices x slice_len | " + " | ".join(names) + " |", "|---" * (4 + len(names)) + "|"]
    for row in rows:
        cells = []
        for name in names:
            r = row["timing"].get(name, {"error": "-"})
            cells.append(r["error"][:40] if "error" in r
                         else f"{r['median_s'] * 1e3:.1f} ms ({r['ratio_to_eager_auto']:.2f}x)")
        lines.append(f"| {row['cell']} | {row['layout']} | {row['n']} | {row['num_slices']} x {row['slice_len']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["lstm", "gru"], choices=["lstm", "gru"])
    parser.add_argument("--layouts", nargs="+", default=["strict", "ragged"], choices=list(CASES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="one case (LSTM, 10 x 20 strict), 3 repeats; no JSON")
    parser.add_argument("--table", action="store_true", help="print the table of the stored JSON and exit")
    args = parser.parse_args()
    path = RESULTS / "compiled_flat_cpu.json"
    if args.table:
        rows = json.loads(path.read_text())["results"]
        print(table(sorted(rows, key=lambda r: (r["cell"], r["layout"] != "strict", -r["num_slices"] * r["slice_len"]))))
        return
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64  # many modules share tensordict's forward wrapper
    if args.quick:
        cases = [("lstm", "strict", 10, 20)]
    else:
        cases = [(c, lay, k, s) for c in args.cells for lay in args.layouts for k, s in CASES[lay]]
    rows = []
    for case in cases:
        rows.append(run_case(*case, 3 if args.quick else args.repeats))
        print(table(rows[-1:]), flush=True)
    print(table(rows))
    if args.quick:
        return
    RESULTS.mkdir(exist_ok=True)
    stored = json.loads(path.read_text())["results"] if path.exists() else []
    key = ("cell", "layout", "num_slices", "slice_len")
    ran = {tuple(r[k] for k in key) for r in rows}
    rows = [r for r in stored if tuple(r.get(k) for k in key) not in ran] + rows
    out = {"environment": environment(torch.device("cpu")), "hidden": HIDDEN, "input": F_IN, "results": rows}
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
