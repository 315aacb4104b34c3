"""minGRU and RG-LRU: the ``parallel`` backend against the same cell's ``scan`` and ``torch.nn.GRU`` (issue 30).

fwd+bwd of ``{min_gru,rglru}_sequence`` at B=32, F=64, H=128, 5% resets, T in {64, 256, 1024, 4096}, and a flat
``SliceSampler`` batch (one row of N=1024 steps, a reset every 64), side by side in one process, eager and compiled
(Inductor), 1 and 2 threads. ``torch.nn.GRU`` runs without resets (it has none): the floor a reset-free GRU costs.
Peak memory (one eager fwd+bwd, 1 thread) per contender. Writes ``results/linear_cpu.json`` and
``results/linear_cpu.png``; ``--report`` writes the table in ``docs/linear_recurrences.md``.

    python benchmarks/bench_linear.py && python benchmarks/bench_linear.py --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, peak_memory, write_section  # noqa: E402

import rnn_functional as rf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "linear_cpu.json"
PAGE = ROOT / "docs" / "linear_recurrences.md"
BEGIN, END = "<!-- BEGIN GENERATED: bench_linear -->", "<!-- END GENERATED: bench_linear -->"
B, F, H, RESET_P = 32, 64, 128, 0.05
SHAPES = {f"T={t}": (B, t, None) for t in (64, 256, 1024, 4096)} | {"flat N=1024, slices of 64": (1, 1024, 64)}
QUICK = {"T=16": (4, 16, None), "flat N=64, slices of 16": (1, 64, 16)}
CELLS = {"min_gru": (rf.init_min_gru_params, rf.min_gru_sequence), "rglru": (rf.init_rglru_params, rf.rglru_sequence)}
COMPILED_MAX_T = 1024  # compiled rows up to here: the T=4096 compiles (the chunked scan unrolled) take minutes each
TARGET_VS_SCAN, TARGET_T = 5.0, 1024  # parallel >= 5x its scan at T = 1024; faster than nn.GRU at T >= 256


def _inputs(shape):
    n, t_len, slice_len = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, t_len, F, generator=g).requires_grad_()
    if slice_len is None:
        is_init = torch.rand(n, t_len, generator=g) < RESET_P
    else:
        is_init = torch.zeros(n, t_len, dtype=torch.bool)
        is_init[:, ::slice_len] = True
    return x, is_init


def contenders(cell: str, shape, compiled: bool) -> dict:
    init, sequence = CELLS[cell]
    x, is_init = _inputs(shape)
    params = init(F, H).apply(lambda t: t.requires_grad_())

    def ours(backend):
        def call(x, params, is_init):
            y, h = sequence(x, None, params, is_init=is_init, backend=backend)
            return y.sum() + h.sum()

        fn = torch.compile(call, fullgraph=True) if compiled else call

        def run():
            fn(x, params, is_init).backward()
        return run

    gru = torch.nn.GRU(F, H, batch_first=True)
    gru_call = torch.compile(gru) if compiled else gru

    def nn_gru():
        y, h = gru_call(x)
        (y.sum() + h.sum()).backward()

    return {"parallel": ours("parallel"), "scan": ours("scan"), "nn.GRU (no resets)": nn_gru}


def run(shapes: dict, threads: list[int], repeats: int, modes: list[str]) -> dict:
    rows = []
    for cell in CELLS:
        for shape_name, shape in shapes.items():
            for mode in modes:
                if mode == "compiled" and shape[1] > COMPILED_MAX_T:
                    continue
                torch._dynamo.reset()  # every contender compiles the same code object: stay under the recompile limit
                calls = contenders(cell, shape, mode == "compiled")
                torch.set_num_threads(1)
                peak = {name: round(peak_memory(fn, torch.device("cpu")) / 2**20, 1) for name, fn in calls.items()}
                for n in threads:
                    torch.set_num_threads(n)
                    timed = interleaved(calls, torch.device("cpu"), repeats=repeats, warmup=2, max_seconds=60, settle=True)
                    ms = {name: round(r["median_s"] * 1e3, 2) for name, r in timed.items() if "median_s" in r}
                    rows.append(dict(cell=cell, shape=shape_name, N=shape[0], T=shape[1], mode=mode, threads=n, ms=ms,
                                     peak_mib=peak, vs_scan=round(ms["scan"] / ms["parallel"], 2),
                                     vs_nn_gru=round(ms["nn.GRU (no resets)"] / ms["parallel"], 2)))
                    print(json.dumps(rows[-1]), flush=True)
    return {"environment": environment(torch.device("cpu")), "reset_probability": RESET_P,
            "sizes": dict(B=B, F=F, H=H), "rows": rows}


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mode in zip(axes, ("eager", "compiled")):
        for cell in CELLS:
            rows = [r for r in doc["rows"] if r["cell"] == cell and r["mode"] == mode and r["threads"] == 1
                    and r["N"] == doc["sizes"]["B"]]
            ts = [r["T"] for r in rows]
            for name, style in (("parallel", "-o"), ("scan", "--s")):
                ax.plot(ts, [r["ms"][name] for r in rows], style, label=f"{cell} {name}")
        rows = [r for r in doc["rows"] if r["cell"] == "min_gru" and r["mode"] == mode and r["threads"] == 1
                and r["N"] == doc["sizes"]["B"]]
        ax.plot([r["T"] for r in rows], [r["ms"]["nn.GRU (no resets)"] for r in rows], ":k", label="nn.GRU (no resets)")
        ax.set(xscale="log", yscale="log", xlabel="T", title=f"{mode}, fwd+bwd, 1 thread")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms per call")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(doc: dict) -> str:
    lines = ["| cell | batch | mode | threads | parallel (ms) | scan (ms) | nn.GRU, no resets (ms) | vs scan | vs nn.GRU "
             "| peak MiB parallel / scan / nn.GRU |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        p = r["peak_mib"]
        lines.append(f"| {r['cell']} | {r['shape']} | {r['mode']} | {r['threads']} | {r['ms']['parallel']} | "
                     f"{r['ms']['scan']} | {r['ms']['nn.GRU (no resets)']} | {r['vs_scan']}x | {r['vs_nn_gru']}x | "
                     f"{p['parallel']} / {p['scan']} / {p['nn.GRU (no resets)']} |")
    return "\n".join(lines)


def section(doc: dict) -> str:
    env, s = doc["environment"], doc["sizes"]
    return (f"{BEGIN}\n\n{table(doc)}\n\nMeasured on {env.get('device_name', 'CPU')} ({env.get('cpu_count')} cores), "
            f"torch {env.get('torch')}: fwd+bwd, B={s['B']} (the flat batch: one row), F={s['F']}, H={s['H']}, one "
            f"layer, {int(doc['reset_probability'] * 100)}% resets (the flat batch: one every 64 steps); median of "
            f"interleaved rounds; compiled up to T={COMPILED_MAX_T} (Inductor, `fullgraph=True`); peak memory of one call at 1 thread (PyTorch's CPU allocator). Regenerate with "
            f"`python benchmarks/bench_linear.py && python benchmarks/bench_linear.py --report`.\n\n{END}")


def report(path: Path) -> None:
    write_section(PAGE, BEGIN, END, section(json.loads(path.read_text())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="write the docs table from the results JSON")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few rounds (a smoke run)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    doc = run(QUICK if args.quick else SHAPES, args.threads, 2 if args.quick else 5, args.modes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
