"""Activation memory and time of ``recompute="none"`` vs ``"full"``, side by side.

    python benchmarks/bench_recompute.py [--device cpu|cuda] [--repeats R] [--threads N] [--no-compile]

LSTM, one layer, 5% random resets, forward + backward of ``y.sum()``. Shape: B=4096, T=32,
F=H=256 on CUDA (the issue's), B=256, T=32, F=H=128 on CPU. Contenders: our ``reference``
(eager; ``"full"`` = chunked checkpointing), ``scan`` compiled with ``fullgraph=True``
(``"full"`` = the recomputing custom backward), ``triton`` where available, and ``pad``
(``"none"`` only: the kernel floor). For each: median time per call (``_timing.interleaved``),
the bytes held between forward and backward (output + saved activations) and the peak bytes
live during forward + backward, both above the start of the call: CUDA ``memory_allocated`` /
``max_memory_allocated``; CPU the allocator's live bytes from ``torch.profiler(profile_memory=True)``
(exact and independent of machine load, unlike RSS). Writes ``results/recompute_<device>.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, sync  # noqa: E402

from rnn_functional import available_backends, init_lstm_params, lstm_sequence  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {
    "cuda": {"B": 4096, "T": 32, "F": 256, "H": 256, "L": 1, "reset_prob": 0.05},
    "cpu": {"B": 256, "T": 32, "F": 128, "H": 128, "L": 1, "reset_prob": 0.05},
}


def _cpu_live(fn) -> tuple[object, int, int]:
    """``(fn(), live bytes at its end, peak live bytes)`` from the CPU allocator's profiler events,
    relative to the start of ``fn``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return out, live, peak


def memory(forward, device: torch.device) -> tuple[int, int]:
    """``(held, peak)`` bytes of one forward + backward of ``forward().sum()``, above the start.

    ``held``: allocated by the forward and still live before the backward (output + saved
    activations). ``peak``: the most bytes live at any time during forward and backward.
    """
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        y = forward()
        sync(device)
        held = torch.cuda.memory_allocated(device) - base
        y.sum().backward()
        sync(device)
        return held, torch.cuda.max_memory_allocated(device) - base
    y, held, fwd_peak = _cpu_live(forward)
    _, _, bwd_peak = _cpu_live(lambda: y.sum().backward())
    return held, max(fwd_peak, held + bwd_peak)


def contenders(device: torch.device, shape: dict, compile_scan: bool) -> dict:
    """name -> forward callable (returns the output ``y``), same weights and inputs for all."""
    gen = torch.Generator().manual_seed(0)
    B, T, F, H, L = (shape[k] for k in "BTFHL")
    params = init_lstm_params(F, H, L, generator=gen).to(device).requires_grad_(True)
    x = torch.randn(B, T, F, generator=gen).to(device)
    is_init = (torch.rand(B, T, generator=gen) < shape["reset_prob"]).to(device)
    is_init[:, 0] = True

    def eager(backend, recompute):
        return lambda: lstm_sequence(x, None, params, is_init=is_init, backend=backend, recompute=recompute)[0]

    def compiled(recompute):
        fn = torch.compile(
            lambda x, is_init: lstm_sequence(x, None, params, is_init=is_init, backend="scan", recompute=recompute)[0],
            fullgraph=True, dynamic=False,
        )
        return lambda: fn(x, is_init)

    c = {"pad/none": eager("pad", "none")}
    for recompute in ("none", "full"):
        c[f"reference/{recompute}"] = eager("reference", recompute)
        if compile_scan:
            c[f"scan compiled/{recompute}"] = compiled(recompute)
        if "triton" in available_backends(device):
            c[f"triton/{recompute}"] = eager("triton", recompute)
    return c


def table(results: dict) -> str:
    lines = ["| contender | ms / call | held after forward (MiB) | peak (MiB) |", "|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} | | |")
            continue
        lines.append(
            f"| {name} | {r['median_s'] * 1e3:.1f} | {r['held_bytes'] / 2**20:.1f} | {r['peak_bytes'] / 2**20:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads on CPU (default 1: on a shared machine more threads than idle "
                         "cores make OpenMP spin and times meaningless)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled scan contenders")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    shape = SHAPES[device.type]
    forwards = contenders(device, shape, compile_scan=not args.no_compile)
    steps = {name: (lambda f=f: f().sum().backward()) for name, f in forwards.items()}
    timing = interleaved(steps, device, warmup=2, repeats=args.repeats)
    results = {}
    for name, fwd in forwards.items():
        r = dict(timing[name])
        if "error" not in r:
            r["held_bytes"], r["peak_bytes"] = memory(fwd, device)
        results[name] = r
    ratios = {}
    for name in results:
        backend, recompute = name.split("/")
        other = results.get(f"{backend}/none")
        if recompute == "full" and other and "error" not in other and "error" not in results[name]:
            ratios[backend] = {
                "time_full_over_none": results[name]["median_s"] / other["median_s"],
                "held_full_over_none": results[name]["held_bytes"] / other["held_bytes"],
                "peak_full_over_none": results[name]["peak_bytes"] / other["peak_bytes"],
            }
    report = {"shape": shape, "environment": environment(device), "results": results, "ratios": ratios}
    out = args.out or RESULTS / f"recompute_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(table(results))
    print(json.dumps(ratios, indent=2))
    return out


if __name__ == "__main__":
    main()
