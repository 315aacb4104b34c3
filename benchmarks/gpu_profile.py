"""Where the time of one ``triton`` sequence call goes on a GPU: host time against kernel time.

    python benchmarks/gpu_profile.py --out DIR/profile.json [--budget-s S]
    TRITON_INTERPRET=1 python benchmarks/gpu_profile.py --smoke --out PATH   # CPU: checks the harness only
    python benchmarks/gpu_profile.py --persistent --out DIR/persistent.json [--budget-s S]   # issue 55's grid

``--persistent`` (issue 55): the flag barrier alone (us per step, a 128-program grid), then per configuration
(LSTM at B in {512, 2048, 128} x H in {256, 128, 512}, T=64, 1% resets, fp32 at the default precision (TF32, as
cuDNN) and bf16; GRU at B=512, H=256), forward and forward+backward, interleaved: ``triton`` (the persistent
kernels where they serve), ``triton_streamed`` (today's kernels, forced), ``pad`` (cuDNN with the resets),
``torch.nn`` (cuDNN without resets: the target), and last the compiled policy step (``torch.compile`` of
``lstm_step`` at B=512, H=256, against ``nn.LSTMCell``). Rows most wanted first, each within the budget.

For a few configurations (two the persistent kernels lose to cuDNN: LSTM fp32 B=2048/H=256 and B=512/H=512; then
LSTM and GRU, B=256, T=64, H in {64, 256}, fp32 with the recurrent matmul in
``ieee`` and ``tf32``, and bf16; 3% resets), forward under ``torch.no_grad`` and forward + backward of
``y.sum()``, on ``triton`` and, at H=256, on ``pad`` (cuDNN around the resets) and ``torch.nn`` (cuDNN without
resets, the floor): the wall time per call (CUDA synchronised, median of interleaved rounds), and one call under
``torch.profiler`` broken into the device time of each kernel (the largest first) and the host time the
call spent before its last launch. A wall time far above the summed kernel time means the call is bound by
the host (Python, dispatch, launches), not by the kernels. Last, the compiled policy step (``torch.compile`` of
``lstm_step``, B=512, H=256, ``no_grad``) the same way, on CUDA only. Writes one JSON and prints a table.
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

CONFIGS = [  # (cell, B, T, H, dtype, matmul precision, backend): two persistent calls slower than cuDNN (issue 55's
    # first lease), then the comparisons at TorchRL's H
    ("lstm", 2048, 64, 256, "float32", None, "triton"), ("lstm", 512, 64, 512, "float32", None, "triton"),
    ("lstm", 256, 64, 256, "float32", None, "torch.nn"), ("lstm", 256, 64, 256, "float32", None, "pad"),
    ("lstm", 256, 64, 256, "float32", "tf32", "triton"), ("lstm", 256, 64, 256, "float32", "ieee", "triton"),
    ("lstm", 256, 64, 64, "float32", "ieee", "triton"), ("lstm", 256, 64, 256, "bfloat16", None, "triton"),
    ("gru", 256, 64, 256, "float32", None, "pad"), ("gru", 256, 64, 256, "float32", "tf32", "triton"),
    ("gru", 256, 64, 256, "float32", "ieee", "triton"),
]
SMOKE = [("lstm", 4, 6, 16, "float32", None, "triton"), ("gru", 4, 6, 16, "float32", None, "pad"),
         ("gru", 4, 6, 16, "float32", None, "torch.nn")]


def make_call(cell: str, B: int, T: int, H: int, dtype: str, precision: str | None, backend: str,
              device: torch.device, backward: bool, reset: float = 0.03):
    gen = torch.Generator().manual_seed(0)
    init = rf.init_lstm_params if cell == "lstm" else rf.init_gru_params
    params = init(H, H, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    x = torch.randn(B, T, H, generator=gen).to(device=device, dtype=params["weight_ih_l0"].dtype)
    is_init = (torch.rand(B, T, generator=gen) < reset).to(device)
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


PERSISTENT = [(cell, B, 64, H, dtype) for B, H in ((512, 256), (2048, 256), (512, 128), (512, 512), (128, 256),
                                                  (2048, 512), (128, 128), (2048, 128), (128, 512))
              for dtype in ("float32", "bfloat16") for cell in ("lstm",)] + [("gru", 512, 64, 256, "float32")]
CONTENDERS = ("triton", "triton_streamed", "pad", "torch.nn")


def barrier_us(device: torch.device, steps: int = 1000) -> float:
    """Microseconds per step of the persistent kernels' flag barrier alone: 16 slices x 8 row groups, no work."""
    import triton
    import triton.language as tl

    from rnn_functional.backends.triton.kernels import _grid_barrier

    @triton.jit
    def only_barriers(flag_ptr, steps):
        for t in range(steps):
            _grid_barrier(flag_ptr + tl.program_id(1), (t + 1) * tl.num_programs(0))

    def call():
        only_barriers[(16, 8)](torch.zeros(8, dtype=torch.int32, device=device), steps, num_warps=4)

    return interleaved({"b": call}, device, warmup=2, repeats=7)["b"]["median_s"] * 1e6 / steps


def persistent_rows(device: torch.device, budget: Budget, smoke: bool) -> list[dict]:
    """Issue 55's comparison: one row per (configuration, mode) with every contender's median us side by side."""
    from rnn_functional.backends.triton import kernel_variant

    configs = [("lstm", 4, 3, 16, "float32"), ("gru", 4, 3, 16, "bfloat16")] if smoke else PERSISTENT
    rows = []
    for cell, B, T, H, dtype in configs:
        for backward in (False, True):
            if not budget.left():
                return rows
            calls = {name: make_call(cell, B, T, H, dtype, None, name.split("_")[0], device, backward, reset=0.01)
                     for name in CONTENDERS}
            forced = {"triton": "persistent" if smoke else "auto", "triton_streamed": "streamed"}
            for name, variant in forced.items():
                calls[name] = (lambda f, v: lambda: _in_variant(kernel_variant, v, f))(calls[name], variant)
            timing = interleaved(calls, device, warmup=1 if smoke else 3, repeats=2 if smoke else 10)
            row = {"cell": cell, "B": B, "T": T, "H": H, "dtype": dtype, "mode": "fwd+bwd" if backward else "fwd",
                   **{f"{k}_us": (v["median_s"] * 1e6 if "error" not in v else v["error"]) for k, v in timing.items()}}
            if isinstance(row["triton_us"], float) and isinstance(row["torch.nn_us"], float):
                row["triton_over_cudnn_no_resets"] = row["triton_us"] / row["torch.nn_us"]
            rows.append(row)
            print(row, flush=True)
    return rows


def _in_variant(kernel_variant, variant: str, call) -> None:
    with kernel_variant(variant):
        call()


def policy_step_calls(device: torch.device, smoke: bool) -> tuple[int, int, dict]:
    """``(B, H, calls)``: the compiled policy step, ``torch.compile(lstm_step)`` (auto: the triton step), and a bare
    ``nn.LSTMCell``, each under ``no_grad``."""
    B, H = (4, 16) if smoke else (512, 256)
    params = rf.init_lstm_params(H, H, device=device)
    x, state = torch.randn(B, H, device=device), (torch.zeros(B, 1, H, device=device),) * 2
    cell = torch.nn.LSTMCell(H, H, device=device)
    step = torch.compile(lambda x, s: rf.lstm_step(x, s, params), fullgraph=True)

    def compiled_step():
        with torch.no_grad():
            step(x, state)

    def bare_cell():
        with torch.no_grad():
            cell(x)

    return B, H, {"compiled_step": compiled_step, "nn.LSTMCell": bare_cell}


def policy_step_row(device: torch.device, smoke: bool) -> dict:
    """The compiled policy step against ``nn.LSTMCell``: median us of each, interleaved."""
    B, H, calls = policy_step_calls(device, smoke)
    timing = interleaved(calls, device, warmup=3, repeats=2 if smoke else 20)
    return {"B": B, "H": H, **{f"{k}_us": v.get("median_s", 0) * 1e6 for k, v in timing.items()}}


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
    ap.add_argument("--persistent", action="store_true", help="issue 55's grid: persistent kernels against cuDNN")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("gpu_profile: no CUDA device (use --smoke with TRITON_INTERPRET=1 to check the harness).")
    budget = Budget(args.budget_s)
    if args.persistent:
        doc = {"environment": environment(device)}
        doc["barrier_us_per_step"] = None if args.smoke else barrier_us(device)
        doc["rows"] = persistent_rows(device, budget, args.smoke)
        doc["policy_step"] = policy_step_row(device, args.smoke) if budget.left() and not args.smoke else None
        doc["coverage"] = budget.report(len(doc["rows"]), 4 if args.smoke else 2 * len(PERSISTENT))
        write_json(args.out, doc)
        print(doc, flush=True)
        return
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
    if budget.left() and not args.smoke:  # the compiled policy step, warmed first: where its time goes (an Inductor
        # compile on CPU would take the dry run past its budget)
        B, H, calls = policy_step_calls(device, False)
        step = calls["compiled_step"]
        row = {"cell": "lstm", "B": B, "H": H, "backend": "torch.compile(lstm_step)", "mode": "step",
               "wall_us": interleaved({"step": step}, device, warmup=3, repeats=20)["step"]["median_s"] * 1e6,
               **breakdown(step, device)}
        rows.append(row)
        print(f"compiled step B={B} H={H}: wall {row['wall_us']:.0f} us, kernels {row['kernel_us']:.0f} us, host "
              f"{row['host_us']:.0f} us, launches {row['launches']}; host top: {row['host_top'][:4]}", flush=True)
        write_json(args.out, {"environment": environment(device), "rows": rows,
                              "coverage": budget.report(len(rows), 2 * len(configs) + 1)})


if __name__ == "__main__":
    main()
