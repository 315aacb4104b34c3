"""The fused ``triton`` backend against TorchRL's ``triton``/``pad`` backends and cuDNN, side by side.

    python benchmarks/bench_triton.py [--repeats R] [--quick]
    TRITON_INTERPRET=1 python benchmarks/bench_triton.py --smoke [--out PATH]   # CPU: checks the harness only

Grid (issue 6): LSTM and GRU, one layer, F = H, B in {256, 2048}, T in {64, 256},
H in {64, 128, 256, 512}, fp32 and bf16, reset probability 0.03 per step; forward (no grad) and
forward + backward of ``y.sum()``. Contenders, in one process on the same inputs:

* ``ours_triton``: ``lstm_sequence``/``gru_sequence(backend="triton")`` with resets;
* ``ours_triton_streamed``: the same call with the streamed kernels forced (``kernel_variant``), where the launcher
  picks the resident ones (H=64, and H=128 for bf16): the measurement that confirms or moves
  the resident threshold (see "Triton kernels on Hopper and Ampere" in docs/backends.md);
* ``torchrl_triton`` / ``torchrl_pad``: TorchRL's ``LSTMModule``/``GRUModule`` in recurrent mode
  with the same ``is_init`` (``recurrent_backend="triton"`` / ``"pad"``);
* ``cudnn_no_resets``: ``torch.nn.LSTM``/``GRU`` over the same shape without resets (the floor
  cuDNN reaches when it does not have to reset).

Times are medians of interleaved rounds (``_timing.interleaved``). For ``ours_triton`` the
forward's per-step time is also compared with the time to read the step's inputs
(``gx``, ``N x G*H``) and write its outputs (``h``, and ``c`` for LSTM) once at the measured
device-to-device copy bandwidth (``hbm_floor_ratio``). Writes
``results/triton_<device name>.json`` and prints a Markdown table. Without a CUDA device it
says so and exits (``--smoke`` runs a tiny CPU configuration through the interpreter instead,
to check the harness; it writes no results).
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Budget, environment, interleaved, sync, write_json  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GRID = {"cell": ["lstm", "gru"], "B": [256, 2048], "T": [64, 256], "H": [64, 128, 256, 512],
        "dtype": ["float32", "bfloat16"]}
SMOKE = {"cell": ["lstm", "gru"], "B": [4], "T": [6], "H": [16], "dtype": ["float32"]}
RESET_PROB = 0.03


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = interleaved({"copy": lambda: dst.copy_(src)}, device, repeats=5)["copy"]
    return 2 * src.numel() / times["median_s"]


def _torchrl_module(cell: str, F: int, H: int, backend: str, device, dtype):
    from torchrl.modules import GRUModule, LSTMModule

    cls = LSTMModule if cell == "lstm" else GRUModule
    return cls(input_size=F, hidden_size=H, in_key="x", out_key="y", recurrent_backend=backend,
               device=device).to(dtype)


def contenders(cfg: dict, device: torch.device, backward: bool) -> dict:
    """name -> zero-argument callable running one call of the configuration ``cfg``."""
    from tensordict import TensorDict
    from torchrl.modules import set_recurrent_mode

    from rnn_functional.backends import triton as triton_backend

    cell, B, T, H = cfg["cell"], cfg["B"], cfg["T"], cfg["H"]
    F, dtype = H, getattr(torch, cfg["dtype"])
    gen = torch.Generator().manual_seed(0)
    init = rf.init_lstm_params if cell == "lstm" else rf.init_gru_params
    params = init(F, H, generator=gen).to(device=device, dtype=dtype)
    x = torch.randn(B, T, F, generator=gen).to(device=device, dtype=dtype)
    is_init = (torch.rand(B, T, generator=gen) < RESET_PROB).to(device)
    n_states = 2 if cell == "lstm" else 1
    states = [torch.zeros(B, 1, H, device=device, dtype=dtype) for _ in range(n_states)]
    seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence
    grad_ctx = torch.enable_grad if backward else torch.no_grad
    if backward:
        params.requires_grad_(True)
        x.requires_grad_(True)

    def finish(y: torch.Tensor) -> None:
        if backward:
            y.sum().backward()

    def ours():
        with grad_ctx():
            state = tuple(states) if cell == "lstm" else states[0]
            finish(seq(x, state, params, is_init=is_init, backend="triton")[0])

    runs = {"ours_triton": ours}
    if triton_backend.variant_for(H, 4 if cell == "lstm" else 3, dtype.itemsize) == "resident":

        def ours_streamed():
            with triton_backend.kernel_variant("streamed"):
                ours()

        runs["ours_triton_streamed"] = ours_streamed

    for backend in ("triton", "pad"):
        try:
            module = _torchrl_module(cell, F, H, backend, device, dtype)
        except Exception as exc:  # reported in the results, not fatal
            runs[f"torchrl_{backend}"] = _raiser(exc)
            continue
        keys = ["recurrent_state_h", "recurrent_state_c"] if cell == "lstm" else ["recurrent_state"]
        td = TensorDict({"x": x, "is_init": is_init[..., None],
                         **{k: torch.zeros(B, T, 1, H, device=device, dtype=dtype) for k in keys}},
                        batch_size=[B, T], device=device)

        def torchrl_call(module=module, td=td):
            with grad_ctx(), set_recurrent_mode(True):
                finish(module(td.clone(False))["y"])

        runs[f"torchrl_{backend}"] = torchrl_call

    nn_cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    cudnn = nn_cls(F, H, batch_first=True, device=device, dtype=dtype)

    def cudnn_call():
        with grad_ctx():
            finish(cudnn(x)[0])

    runs["cudnn_no_resets"] = cudnn_call
    return runs


def _raiser(exc: Exception):
    def call():
        raise exc

    return call


def hbm_floor_s(cfg: dict, bandwidth: float) -> float:
    """Seconds to read every step's inputs and write its outputs once, for the whole sequence."""
    gates = 4 if cfg["cell"] == "lstm" else 3
    itemsize = torch.empty((), dtype=getattr(torch, cfg["dtype"])).element_size()
    per_step = cfg["B"] * cfg["H"] * itemsize * (gates + (2 if cfg["cell"] == "lstm" else 1))
    return cfg["T"] * per_step / bandwidth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="B=256, T=64 only")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny CPU run through the interpreter (results only with --out)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: results/triton_<device>.json)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no configuration after this many seconds (the JSON, rewritten after each, says "
                             "what ran)")
    args = parser.parse_args()

    if args.smoke:
        device, grid = torch.device("cpu"), SMOKE
        if "triton" not in rf.available_backends(device):
            sys.exit("--smoke needs TRITON_INTERPRET=1 (set before starting Python).")
    elif not torch.cuda.is_available():
        print("bench_triton: no CUDA GPU available here; nothing to benchmark (the harness needs one). "
              "Use --smoke with TRITON_INTERPRET=1 to check the harness on CPU.")
        return
    else:
        device, grid = torch.device("cuda"), dict(GRID)
        if args.quick:
            # under a budget, H=64 first: on the first lease (H200) TorchRL's triton row at H=256 did not finish
            grid.update(B=[256], T=[64], H=[64, 256, 128, 512])

    env = environment(device)
    name = re.sub(r"[^A-Za-z0-9]+", "_", env["device_name"]).strip("_").lower()
    out = args.out or (None if args.smoke else RESULTS / f"triton_{name}.json")
    budget = Budget(args.budget_s)
    bandwidth = copy_bandwidth(device)
    configs = [dict(zip(grid.keys(), values)) for values in itertools.product(*grid.values())]
    rows = []
    for cfg in configs:
        if not budget.left():
            break
        for mode in ("fwd", "fwd+bwd"):
            timings = interleaved(contenders(cfg, device, mode == "fwd+bwd"), device, repeats=args.repeats)
            row = {**cfg, "mode": mode, "reset_prob": RESET_PROB, "results": timings}
            ours = timings.get("ours_triton", {}).get("median_s")
            if ours:
                row["speedup_vs"] = {k: v["median_s"] / ours for k, v in timings.items() if "median_s" in v}
                if mode == "fwd":
                    row["hbm_floor_ratio"] = ours / hbm_floor_s(cfg, bandwidth)
            rows.append(row)
            _print_row(row)
            sync(device)
            if out is not None:  # after every row: a step stopped at its time limit keeps what it measured
                write_json(out, {"environment": env, "copy_bandwidth_Bps": bandwidth, "rows": rows,
                                 "coverage": budget.report(len(rows), 2 * len(configs))})
    print(f"wrote {out}" if out is not None else "smoke run done (no results written).")


def _print_row(row: dict) -> None:
    cells = []
    for name, res in row["results"].items():
        cells.append(f"{name}={res['median_s'] * 1e3:.3f}ms" if "median_s" in res else f"{name}=ERROR({res['error'][:60]})")
    extra = f" hbm_floor_ratio={row['hbm_floor_ratio']:.2f}" if "hbm_floor_ratio" in row else ""
    print(f"| {row['cell']} B={row['B']} T={row['T']} H={row['H']} {row['dtype']} {row['mode']} | "
          + " | ".join(cells) + f" |{extra}", flush=True)


if __name__ == "__main__":
    main()
