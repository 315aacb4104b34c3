"""CPU timings of every eager-capable backend, the measurement behind ``auto`` = ``pad`` on CPU.

    python benchmarks/bench_cpu_backends.py [--threads N] [--repeats R] [--reset-probs 0 0.01 0.05] [--batch B --steps T]

Shape of issue 2: B=32, T=64, F=64, H=128, one layer, 5% random resets (plus every row starting a
trajectory at t=0); forward (``torch.no_grad``) and forward+backward of ``y.sum()``, LSTM and
GRU. Side by side in one process, contenders interleaved (``_timing.interleaved``): our
``reference``, ``scan`` (eager and compiled with ``fullgraph=True``), ``pad`` and ``auto``, and
``torch.nn.LSTM``/``GRU`` on the same input *without* resets (the kernel floor). Writes
``results/cpu_backends.json`` (``results/cpu_backends_sweep.json`` when ``--reset-probs`` asks for
other reset probabilities than issue 2's 5%; ``results/cpu_backends_sweep_B{B}_T{T}.json`` at another
``--batch``/``--steps``) and prints a Markdown table; ``plot.py`` draws it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved  # noqa: E402
from plot import cpu_backend_markdown  # noqa: E402
from run import RESULTS, sequence_contenders  # noqa: E402

SHAPE = {"B": 32, "T": 64, "F": 64, "H": 128, "L": 1, "reset_prob": 0.05}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--reset-probs", type=float, nargs="+", default=[SHAPE["reset_prob"]])
    ap.add_argument("--batch", type=int, default=SHAPE["B"])
    ap.add_argument("--steps", type=int, default=SHAPE["T"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    shape = {**SHAPE, "B": args.batch, "T": args.steps}
    sweep = args.reset_probs != [SHAPE["reset_prob"]]
    name = "cpu_backends_sweep" if sweep else "cpu_backends"
    if shape != SHAPE:
        name += f"_B{args.batch}_T{args.steps}"
    out = args.out or RESULTS / f"{name}.json"
    env = environment(device)
    rows = []
    for p in args.reset_probs:
        for cell in ("lstm", "gru"):
            for grad in (False, True):
                torch._dynamo.reset()
                s = shape
                contenders, check = sequence_contenders(
                    cell, s["B"], s["T"], s["F"], s["H"], s["L"], p, device, grad,
                    eager_scan=True, torchrl=False, modules=False,
                )
                res = interleaved(contenders, device, warmup=2, repeats=args.repeats, max_seconds=15.0)
                mode = "fwd+bwd" if grad else "fwd"
                rows.append({"cell": cell, "mode": mode, "reset_prob": p, "check": check, "results": res})
                print(f"{cell} {mode} p={p} done", flush=True)
    doc = {"env": env, "shape": {**shape, "reset_prob": args.reset_probs if sweep else SHAPE["reset_prob"]},
           "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(cpu_backend_markdown(doc))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
