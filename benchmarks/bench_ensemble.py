"""Ensemble of E recurrent models: ``torch.vmap`` over stacked params vs a Python loop over members.

    python benchmarks/bench_ensemble.py [--members 8] [--batch 32] [--time 64] [--hidden 128]
                                        [--cell lstm|gru] [--repeats R] [--threads N] [--no-compile] [--no-unrolled]

Forward + backward of ``y.sum()`` (grads w.r.t. every member's params), input shared by the
members, 5% random resets, one layer, F = H. Contenders, side by side in one process (timed by
``_timing.interleaved``: rotating rounds, median):

- ``eager loop``: one ``backend="auto"`` call per member (with interior resets ``auto`` picks
  ``reference``; see docs/backends.md).
- ``eager vmap``: ``torch.vmap`` over the stacked params, ``backend="auto"`` (``reference``
  under eager vmap), and ``eager vmap (scan)``: the same forced to ``scan`` (why ``auto``
  does not pick it).
- ``compiled loop``: one member's fwd+bwd compiled (``fullgraph=True``, ``scan``), called per member.
- ``compiled vmap``: ``torch.compile(torch.vmap(...), fullgraph=True)`` fwd+bwd with ``auto``
  (``scan``) and with ``reference`` (an unrolled loop); ``compiled vmap fwd``: forward only.

A contender that fails records its error (torch 2.13: compiled autograd through a vmapped
``scan`` fails, see docs/ensembles.md). Writes ``results/ensemble_cpu.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--time", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-unrolled", action="store_true", help="skip 'compiled vmap (reference)' (minutes to compile)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (1 is steadier on a shared CPU)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ensemble_cpu.json"))
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    e, b, t, h = args.members, args.batch, args.time, args.hidden
    init = rf.ensemble_init_lstm_params if args.cell == "lstm" else rf.ensemble_init_gru_params
    seq = rf.lstm_sequence if args.cell == "lstm" else rf.gru_sequence
    g = torch.Generator().manual_seed(0)
    stacked = init(e, h, h, generator=g).requires_grad_(True)
    members = rf.unstack_params(stacked)
    x = torch.randn(b, t, h, generator=g)
    is_init = torch.rand(b, t, generator=g) < 0.05

    def member_out(p, backend="auto"):
        return seq(x, None, p, is_init=is_init, backend=backend)[0]

    def ensemble_out(params, backend="auto"):
        return torch.vmap(lambda p: member_out(p, backend))(params)

    def backward(y: torch.Tensor) -> None:
        torch.autograd.grad(y.sum(), list(stacked.values()))

    def loop_fwd_bwd(step) -> None:
        torch.autograd.grad(sum(step(p).sum() for p in members), list(stacked.values()))

    contenders = {
        "eager loop": lambda: loop_fwd_bwd(member_out),
        "eager vmap": lambda: backward(ensemble_out(stacked)),
        "eager vmap (scan)": lambda: backward(ensemble_out(stacked, "scan")),
    }
    if not args.no_compile:
        compiled_member = torch.compile(member_out, fullgraph=True)
        compiled_vmap = torch.compile(ensemble_out, fullgraph=True)
        compiled_vmap_fwd = torch.compile(ensemble_out, fullgraph=True)

        def fwd_only() -> None:
            with torch.no_grad():
                compiled_vmap_fwd(stacked)

        contenders.update({
            "compiled loop": lambda: loop_fwd_bwd(compiled_member),
            "compiled vmap": lambda: backward(compiled_vmap(stacked)),
            "compiled vmap fwd": fwd_only,
        })
        if not args.no_unrolled:
            compiled_vmap_ref = torch.compile(lambda p: ensemble_out(p, "reference"), fullgraph=True)
            contenders["compiled vmap (reference)"] = lambda: backward(compiled_vmap_ref(stacked))
    results = interleaved(contenders, device, warmup=2, repeats=args.repeats, max_seconds=60.0)

    base = results["eager loop"].get("median_s")
    print(f"\nE={e} B={b} T={t} H={h} {args.cell.upper()}, fwd+bwd, shared input, 5% resets ({torch.get_num_threads()} threads)")
    print("| contender | median ms | vs eager loop | first call s |\n|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | error: {r['error'][:90]} | | |")
            continue
        ratio = f"{base / r['median_s']:.2f}x" if base else ""
        print(f"| {name} | {1e3 * r['median_s']:.1f} | {ratio} | {r['first_call_s']:.1f} |")

    out = {
        "benchmark": "ensemble vmap vs loop, fwd+bwd",
        "config": {"members": e, "batch": b, "time": t, "hidden": h, "input": h, "layers": 1,
                   "cell": args.cell, "reset_prob": 0.05, "dtype": "float32"},
        "environment": environment(device),
        "results": results,
        "speedup_vs_eager_loop": {
            n: base / r["median_s"] for n, r in results.items() if base and "median_s" in r
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
