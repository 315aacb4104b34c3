"""Our LSTMModule against TorchRL's LSTMModule and bare torch.nn, side by side on CPU.

    python benchmarks/bench_modules.py [--threads N] [--repeats R]

Two measurements, each in one process with contenders interleaved (``_timing.interleaved``)
and sharing the same weights and inputs:

* step mode (a collector's policy call), eager, ``torch.no_grad``: one call on a ``[B]``
  TensorDict with B=32, F=64, H=128 (``is_init`` True for ~5% of rows) of our ``LSTMModule``,
  TorchRL's ``LSTMModule`` (default, ``nn.LSTM`` kernels, and ``python_based=True``), and a bare
  ``nn.LSTMCell`` call on tensors (no TensorDict, no reset: the floor). Each timed sample is
  ``--inner`` calls; the per-call time is reported.
* recurrent mode, forward + backward of ``y.sum()`` on a ``[B, T]`` TensorDict with B=32, T=64,
  F=64, H=128, ``is_init`` True at t=0 and with probability 5% elsewhere: ours with every eager
  ``recurrent_backend`` and TorchRL's with every backend it can run on CPU; "TorchRL best" is
  the fastest of those.

Writes ``results/modules_cpu.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, repeated_no_grad  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STEP = {"B": 32, "F": 64, "H": 128, "reset_prob": 0.05}
RECURRENT = {"B": 32, "T": 64, "F": 64, "H": 128, "L": 1, "reset_prob": 0.05}
KEYS = dict(in_keys=["x", "h", "c"], out_keys=["y", ("next", "h"), ("next", "c")])


def step_contenders(trm, inner: int) -> dict:
    B, F, H = STEP["B"], STEP["F"], STEP["H"]
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    theirs = trm.LSTMModule(F, H, **KEYS)
    theirs_py = trm.LSTMModule(F, H, python_based=True, **KEYS)
    theirs_py.lstm.load_state_dict(theirs.lstm.state_dict())
    ours = rf.LSTMModule(lstm=theirs.lstm, **KEYS)
    cell = nn.LSTMCell(F, H)
    cell.weight_ih.data.copy_(theirs.lstm.weight_ih_l0)
    cell.weight_hh.data.copy_(theirs.lstm.weight_hh_l0)
    cell.bias_ih.data.copy_(theirs.lstm.bias_ih_l0)
    cell.bias_hh.data.copy_(theirs.lstm.bias_hh_l0)

    x = torch.randn(B, F, generator=g)
    h, c = torch.randn(B, 1, H, generator=g), torch.randn(B, 1, H, generator=g)
    is_init = torch.rand(B, 1, generator=g) < STEP["reset_prob"]

    def td():
        return TensorDict({"x": x, "h": h, "c": c, "is_init": is_init}, [B])

    tds = {name: td() for name in ("ours", "torchrl", "torchrl_python")}
    with torch.no_grad():  # same results before timing
        ref = theirs(td())["y"]
        torch.testing.assert_close(ours(td())["y"], ref, atol=1e-5, rtol=1e-4)
    h0, c0 = h[:, 0], c[:, 0]

    def repeat(fn):
        return repeated_no_grad(fn, inner)

    return {
        "ours LSTMModule": repeat(lambda: ours(tds["ours"])),
        "torchrl LSTMModule": repeat(lambda: theirs(tds["torchrl"])),
        "torchrl LSTMModule python_based": repeat(lambda: theirs_py(tds["torchrl_python"])),
        "nn.LSTMCell (tensors, no reset)": repeat(lambda: cell(x, (h0, c0))),
    }


def recurrent_contenders(trm) -> dict:
    B, T, F, H = (RECURRENT[k] for k in ("B", "T", "F", "H"))
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    base = trm.LSTMModule(F, H, **KEYS)
    x = torch.randn(B, T, F, generator=g)
    is_init = torch.rand(B, T, 1, generator=g) < RECURRENT["reset_prob"]
    is_init[:, 0] = True
    zeros = torch.zeros(B, T, 1, H)
    data = TensorDict({"x": x, "h": zeros, "c": zeros.clone(), "is_init": is_init}, [B, T])

    modules = {}
    for backend in ("pad", "scan", "reference", "auto"):
        modules[f"ours recurrent_backend={backend}"] = rf.LSTMModule(lstm=base.lstm, recurrent_backend=backend, **KEYS)
    for backend in ("pad", "scan", "auto"):
        modules[f"torchrl recurrent_backend={backend}"] = trm.LSTMModule(lstm=base.lstm, recurrent_backend=backend, **KEYS)
    py = trm.LSTMModule(F, H, python_based=True, **KEYS)
    py.lstm.load_state_dict(base.lstm.state_dict())
    modules["torchrl python_based (pad)"] = py

    def fwd_bwd(module):
        def run():
            module.zero_grad(set_to_none=True)
            with trm.set_recurrent_mode(True):
                out = module(data.clone(False))
            out["y"].sum().backward()
        return run

    return {name: fwd_bwd(m) for name, m in modules.items()}


def _ratios(results: dict, ours: str, others: list[str]) -> dict:
    t = results[ours]["median_s"]
    return {o: results[o]["median_s"] / t for o in others if "median_s" in results.get(o, {})}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--inner", type=int, default=50, help="step-mode calls per timed sample")
    ap.add_argument("--out", type=Path, default=RESULTS / "modules_cpu.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import torchrl.modules as trm

    device = torch.device("cpu")
    step = interleaved(step_contenders(trm, args.inner), device, repeats=args.repeats)
    for res in step.values():
        for k in ("median_s", "min_s"):
            if k in res:
                res[k.replace("_s", "_us_per_call")] = res.pop(k) / args.inner * 1e6
        res.pop("first_call_s", None)
    rec = interleaved(recurrent_contenders(trm), device, repeats=args.repeats, max_seconds=30)
    trl = {n: r["median_s"] for n, r in rec.items() if n.startswith("torchrl") and "median_s" in r}
    best_trl = min(trl, key=trl.get)
    ours_default = "ours recurrent_backend=pad"
    report = {
        "environment": environment(device),
        "step": {
            "shape": STEP,
            "inner_calls": args.inner,
            "results": step,
            "ratio_vs_ours": {
                n: r["median_us_per_call"] / step["ours LSTMModule"]["median_us_per_call"]
                for n, r in step.items() if "median_us_per_call" in r
            },
        },
        "recurrent_fwd_bwd": {
            "shape": RECURRENT,
            "results": rec,
            "torchrl_best": best_trl,
            "speedup_ours_default_vs_torchrl_best": rec[best_trl]["median_s"] / rec[ours_default]["median_s"],
            "ratio_vs_ours_default": _ratios(rec, ours_default, list(rec)),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))

    print(f"step mode, B={STEP['B']} F={STEP['F']} H={STEP['H']}, eager, no_grad (us per call, median)")
    print("| contender | us/call | x ours |\n|---|---|---|")
    for n, r in step.items():
        if "median_us_per_call" in r:
            print(f"| {n} | {r['median_us_per_call']:.1f} | {report['step']['ratio_vs_ours'][n]:.2f} |")
        else:
            print(f"| {n} | {r['error']} | |")
    print(f"\nrecurrent mode fwd+bwd, {RECURRENT} (ms per call, median)")
    print("| contender | ms | x ours (pad) |\n|---|---|---|")
    for n, r in rec.items():
        if "median_s" in r:
            print(f"| {n} | {r['median_s'] * 1e3:.2f} | {report['recurrent_fwd_bwd']['ratio_vs_ours_default'][n]:.2f} |")
        else:
            print(f"| {n} | {r['error'][:80]} | |")
    print(f"\nTorchRL best: {best_trl}; ours (pad) is "
          f"{report['recurrent_fwd_bwd']['speedup_ours_default_vs_torchrl_best']:.2f}x faster")
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
