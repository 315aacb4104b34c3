"""Where the time of one ``triton`` sequence call goes on a GPU: host time against kernel time.

    python benchmarks/gpu_profile.py --out DIR/profile.json [--budget-s S]
    TRITON_INTERPRET=1 python benchmarks/gpu_profile.py --smoke --out PATH   # CPU: checks the harness only

For a few configurations (LSTM and GRU, B=256, T=64, H in {64, 256}, fp32 with the recurrent matmul in
``ieee`` and ``tf32``, and bf16; 3% resets), forward under ``torch.no_grad`` and forward + backward of
``y.sum()``, on ``triton`` and, at H=256, on ``pad`` (cuDNN around the resets) and ``torch.nn`` (cuDNN without
resets, the floor): the wall time per call (CUDA synchronised, median of interleaved rounds), and one call under
``torch.profiler`` broken into the device time of each kernel (the largest first) and the host time the
call spent before its last launch. A wall time far above the summed kernel time means the call is bound by
the host (Python, dispatch, launches), not by the kernels. Writes one JSON and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Budget, environment, interleaved, write_json  # noqa: E402

import rnn_functional as rf  # noqa: E402

CONFIGS = [  # (cell, B, T, H, dtype, matmul precision, backend), the comparisons at TorchRL's H first
    ("lstm", 256, 64, 256, "float32", None, "torch.nn"), ("lstm", 256, 64, 256, "float32", None, "pad"),
    ("lstm", 256, 64, 256, "float32", "tf32", "triton"), ("lstm", 256, 64, 256, "float32", "ieee", "triton"),
    ("lstm", 256, 64, 64, "float32", "ieee", "triton"), ("lstm", 256, 64, 256, "bfloat16", None, "triton"),
    ("gru", 256, 64, 256, "float32", None, "pad"), ("gru", 256, 64, 256, "float32", "tf32", "triton"),
    ("gru", 256, 64, 256, "float32", "ieee", "triton"),
]
SMOKE = [("lstm", 4, 6, 16, "float32", None, "triton"), ("gru", 4, 6, 16, "float32", None, "pad"),
         ("gru", 4, 6, 16, "float32", None, "torch.nn")]


def make_call(cell: str, B: int, T: int, H: int, dtype: str, precision: str | None, backend: str,
              device: torch.device, backward: bool):
    gen = torch.Generator().manual_seed(0)
    init = rf.init_lstm_params if cell == "lstm" else rf.init_gru_params
    params = init(H, H, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    x = torch.randn(B, T, H, generator=gen).to(device=device, dtype=params["weight_ih_l0"].dtype)
    is_init = (torch.rand(B, T, generator=gen) < 0.03).to(device)
    seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence
    floor = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(H, H, batch_first=True).to(device, params["weight_ih_l0"].dtype)
    if backward:
        params.requires_grad_(True)
        x.requires_grad_(True)

    def run():
        if backend == "torch.nn":
            return floor(x)[0]
        return seq(x, None, params, is_init=is_init, backend=backend, matmul_precision=precision)[0]

    def call() -> None:
        with torch.enable_grad() if backward else torch.no_grad():
            y = run()
            if backward:
                y.sum().backward()

    return call


def breakdown(call, device: torch.device) -> dict:
    """One call under the profiler: summed device time per kernel name (largest first) and the host span."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    kernels, launches = [], 0
    for row in prof.key_averages():
        if row.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"):
            launches += row.count
        if getattr(row, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels.append({"name": row.key[:120], "us": row.self_device_time_total, "count": row.count})
    kernels.sort(key=lambda k: -k["us"])
    host = sorted(((r.key, r.self_cpu_time_total, r.count) for r in prof.key_averages()
                   if getattr(r, "device_type", None) != torch.autograd.DeviceType.CUDA), key=lambda r: -r[1])
    return {"kernel_us": sum(k["us"] for k in kernels), "kernels": kernels[:8], "launches": launches,
            "host_us": sum(r[1] for r in host), "host_top": [{"name": n[:80], "us": us, "count": c} for n, us, c in host[:8]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU configurations through the interpreter")
    ap.add_argument("--budget-s", type=float, default=None, help="start no configuration after this many seconds")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("gpu_profile: no CUDA device (use --smoke with TRITON_INTERPRET=1 to check the harness).")
    budget = Budget(args.budget_s)
    configs = SMOKE if args.smoke else CONFIGS
    rows = []
    for cell, B, T, H, dtype, precision, backend in configs:
        for backward in (False, True):
            if not budget.left():
                break
            call = make_call(cell, B, T, H, dtype, precision, backend, device, backward)
            timing = interleaved({"call": call}, device, warmup=3, repeats=5 if args.smoke else 15)["call"]
            row = {"cell": cell, "B": B, "T": T, "H": H, "dtype": dtype, "matmul_precision": precision, "backend": backend,
                   "mode": "fwd+bwd" if backward else "fwd"}
            rows.append(row)
            if "error" in timing:  # a configuration that cannot run is a row saying why, not the end of the run
                row["error"] = timing["error"]
                print(f"{backend} {cell} B={B} T={T} H={H} {dtype} {precision} {row['mode']}: {row['error']}", flush=True)
            else:
                row.update(wall_us=timing["median_s"] * 1e6, **breakdown(call, device))
                print(f"{backend} {cell} B={B} T={T} H={H} {dtype} {precision} {row['mode']}: wall {row['wall_us']:.0f} "
                      f"us, kernels {row['kernel_us']:.0f} us, host {row['host_us']:.0f} us, launches {row['launches']}; "
                      "top: " + ", ".join(f"{k['name'][:40]}={k['us']:.0f}us" for k in row["kernels"][:3]), flush=True)
            write_json(args.out, {"environment": environment(device), "rows": rows,
                                  "coverage": budget.report(len(rows), 2 * len(configs))})


if __name__ == "__main__":
    main()
