"""DreamerV3's block GRU, side by side with TorchRL's ``DreamerV3BlockGRU`` / ``DreamerV3BlockGRUCell`` in one process.

Three workloads, CPU, forward + backward, 5% resets (``is_init``), each at 1 and 2 threads:

* ``eager``: one sequence call, ``output.sum().backward()``; TorchRL's ``reference`` and ``scan`` backends
  against ours (``auto``, and ``scan``/``reference`` for the record). Target: ours ``auto`` >= 1.5x TorchRL's best.
* ``compiled``: the same modules under ``torch.compile(fullgraph=True)`` (TorchRL's ``reference`` backend, ours
  ``auto``). Target: >= 1.5x.
* ``imagination``: 15 steps of the cell with a small policy MLP in between (the next input from the state),
  ``B = 1024``, the whole rollout compiled, loss = sum of the states, backward through it (``small`` shape's
  ``F = H = P``, blocks).

Every workload also times its matrix products alone, compiled (the same GEMMs, nothing elementwise; a sequence's
input products for all steps at once): the floor of any implementation of this math. TorchRL's time over it
bounds the speedup anyone could reach.

Shapes: ``small`` B=32, T=64, F=H=P=128, 4 blocks; ``torchrl`` B=16, T=64, F=H=P=512, 8 blocks (TorchRL's own
benchmark shape). Writes ``results/block_gru_cpu.json`` (``--workloads`` replaces those workloads' rows in it and
keeps the others, with each run's environment); ``--report`` writes the table in ``docs/model_based.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, write_section  # noqa: E402

import rnn_functional as rf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "block_gru_cpu.json"
PAGE = ROOT / "docs" / "model_based.md"
BEGIN = "<!-- BEGIN GENERATED (benchmarks/bench_block_gru.py --report) -->"
END = "<!-- END GENERATED (benchmarks/bench_block_gru.py --report) -->"
SHAPES = {"small": dict(B=32, T=64, F=128, nb=4), "torchrl": dict(B=16, T=64, F=512, nb=8)}
QUICK = {"tiny": dict(B=4, T=6, F=8, nb=2)}
TARGET = 1.5
RESET_P = 0.05
ROLLOUT_STEPS, ROLLOUT_B = 15, 1024
FLOOR = "matrix products alone, compiled"


def _pair(shape: dict, with_backend: str | None = None):
    """TorchRL's sequence module and ours with the same weights."""
    import torchrl.modules as tm

    f, nb = shape["F"], shape["nb"]
    theirs = tm.DreamerV3BlockGRU(f, f, projection_size=f, num_blocks=nb, recurrent_backend=with_backend or "reference")
    ours = rf.DreamerV3BlockGRU(f, f, projection_size=f, num_blocks=nb)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _sequence_call(module, x, is_init, backend: str | None = None):
    def run():
        if backend is not None:
            module.recurrent_backend = backend
        y, _ = module(x, None, is_init)
        y.sum().backward()
    return run


def _inputs(shape: dict):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape["B"], shape["T"], shape["F"], generator=g)
    return x, torch.rand(shape["B"], shape["T"], generator=g) < RESET_P


def eager_contenders(shape: dict) -> dict:
    theirs, ours = _pair(shape)
    theirs_scan, _ = _pair(shape, "scan")
    theirs_scan.load_state_dict(theirs.state_dict())
    x, is_init = _inputs(shape)
    return {
        "torchrl reference": _sequence_call(theirs, x, is_init),
        "torchrl scan": _sequence_call(theirs_scan, x, is_init),
        "ours auto": _sequence_call(ours, x, is_init, "auto"),
        "ours scan": _sequence_call(ours, x, is_init, "scan"),
        "ours reference": _sequence_call(ours, x, is_init, "reference"),
        FLOOR: sequence_floor(ours, shape, x),
    }


def compiled_contenders(shape: dict) -> dict:
    theirs, ours = _pair(shape)
    x, is_init = _inputs(shape)
    return {
        "torchrl reference, compiled": _sequence_call(torch.compile(theirs, fullgraph=True), x, is_init),
        "ours auto, compiled": _sequence_call(torch.compile(ours, fullgraph=True), x, is_init),
        FLOOR: sequence_floor(ours, shape, x),
    }


def _product_weights(weights: dict, nb: int) -> dict:
    """The weights a floor multiplies by, each as one matrix, laid out once per call (F = H = P): the input and
    hidden linears, their parts of the first dynamics layer (block ``j``'s columns side by side), its own blocks
    ``[nb, Hb, Hb]`` and the gates ``[nb, Hb, 3 Hb]``."""
    w0 = weights["dynamic_linears.0.weight"]
    f = w0.shape[0] * w0.shape[2]
    hb = f // nb

    def dynamics_part(rows: slice) -> torch.Tensor:  # [nb, P, Hb] -> [P, H]
        return w0[:, rows].transpose(0, 1).reshape(-1, f)

    return {"input": weights["input_linear.weight"].T, "hidden": weights["hidden_linear.weight"].T,
            "from_x": dynamics_part(slice(hb, hb + f)), "from_h": dynamics_part(slice(hb + f, None)),
            "own": w0[:, :hb], "gates": weights["gates.weight"], "nb": nb}


def _input_products(w: dict, x: torch.Tensor) -> torch.Tensor:
    """``x [..., F]``'s matrix products in the cell (input linear, then its part of the first dynamics layer):
    ``[..., H]``. Nothing elementwise: a floor's part."""
    return x @ w["input"] @ w["from_x"]


def _state_products(w: dict, from_x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One step's matrix products that depend on the state ``h [B, H]`` (hidden linear, the first dynamics layer's
    own blocks and hidden part, gates), ``from_x`` the input's (:func:`_input_products`), with nothing elementwise
    between them but a state update: the step of a floor."""
    nb, f = w["nb"], h.shape[-1]
    own = torch.bmm(h.reshape(-1, nb, f // nb).transpose(0, 1), w["own"])  # [nb, B, Hb]
    z = own.transpose(0, 1).reshape(-1, f) + from_x + h @ w["hidden"] @ w["from_h"]
    g = torch.bmm(z.reshape(-1, nb, f // nb).transpose(0, 1), w["gates"]).transpose(0, 1).reshape(-1, 3 * f)
    return 0.5 * (h + g[:, :f])


def sequence_products(weights: dict, x: torch.Tensor, nb: int) -> torch.Tensor:
    """A sequence call's matrix products alone (``x [B, T, F]``, zero initial state): the input's for all ``T`` steps
    at once (as ours runs them), then each step's on the state; returns the sum of the states."""
    w = _product_weights(weights, nb)
    from_x = _input_products(w, x)  # [B, T, H]
    h = x.new_zeros(x.shape[0], x.shape[-1])
    total = x.new_zeros(())
    for t in range(x.shape[1]):
        h = _state_products(w, from_x[:, t], h)
        total = total + h.sum()
    return total


def sequence_floor(ours, shape: dict, x: torch.Tensor):
    """:func:`sequence_products` with ``ours``' weights, compiled, fwd+bwd: the floor of any implementation."""
    weights, nb = dict(ours.cell.named_parameters()), shape["nb"]
    floor = torch.compile(sequence_products, fullgraph=True)
    return lambda: floor(weights, x, nb).backward()


def imagination_contenders(shape: dict) -> dict:
    """``ROLLOUT_STEPS`` cell steps from a batch of states, each next input from a small policy MLP."""
    import torchrl.modules as tm

    f, nb = shape["F"], shape["nb"]
    theirs = tm.DreamerV3BlockGRUCell(f, f, projection_size=f, num_blocks=nb)
    ours = rf.DreamerV3BlockGRUCell(f, f, projection_size=f, num_blocks=nb)
    ours.load_state_dict(theirs.state_dict())
    policy = nn.Sequential(nn.Linear(f, 64), nn.SiLU(), nn.Linear(64, f))
    h0 = torch.randn(ROLLOUT_B, f, generator=torch.Generator().manual_seed(1))

    def rollout(cell):
        def run(h):
            total = h.new_zeros(())
            for _ in range(ROLLOUT_STEPS):
                h = cell(policy(h), h)
                total = total + h.sum()
            return total
        compiled = torch.compile(run, fullgraph=True)
        return lambda: compiled(h0).backward()

    weights = dict(ours.named_parameters())

    def gemms(h):
        """The rollout's matrix products alone (the policy's and the cell's, :func:`_input_products` and
        :func:`_state_products`): the floor any cell with this math pays, compiled like the others."""
        w = _product_weights(weights, nb)
        total = h.new_zeros(())
        for _ in range(ROLLOUT_STEPS):
            h = _state_products(w, _input_products(w, policy(h)), h)
            total = total + h.sum()
        return total

    floor = torch.compile(gemms, fullgraph=True)
    return {"torchrl cell, compiled rollout": rollout(theirs), "ours cell, compiled rollout": rollout(ours),
            "matrix products alone, compiled": lambda: floor(h0).backward()}


WORKLOADS = {
    "eager": (eager_contenders, "torchrl reference", "torchrl scan", "ours auto"),
    "compiled": (compiled_contenders, "torchrl reference, compiled", None, "ours auto, compiled"),
    "imagination": (imagination_contenders, "torchrl cell, compiled rollout", None, "ours cell, compiled rollout"),
}


def run(shapes: dict, threads: list[int], repeats: int, workloads: list[str]) -> dict:
    rows = []
    for shape_name, shape in shapes.items():
        for workload in workloads:
            if workload == "imagination" and shape_name == "torchrl":
                continue  # the rollout is timed at the small shape (B = 1024 rows already)
            build, base_a, base_b, ours = WORKLOADS[workload]
            contenders = build(shape)  # built (and compiled) once; timed at every thread count
            for n in threads:
                torch.set_num_threads(n)
                # settle: each timed call follows its own previous call, as in a training loop
                timed = interleaved(contenders, torch.device("cpu"), repeats=repeats, warmup=2, max_seconds=30,
                                    settle=True)
                ms = {name: round(r["median_s"] * 1e3, 2) for name, r in timed.items() if "median_s" in r}
                best = min(ms[b] for b in (base_a, base_b) if b is not None)
                rows.append(dict(workload=workload, shape=shape_name, **shape, threads=n, ms=ms,
                                 speedup=round(best / ms[ours], 2), target=TARGET, met=best / ms[ours] >= TARGET))
                print(json.dumps(rows[-1]), flush=True)
    return {"environment": environment(torch.device("cpu")), "reset_probability": RESET_P, "rows": rows}


def table(doc: dict) -> str:
    lines = ["| workload | shape | threads | TorchRL (ms) | ours (ms) | speedup | target 1.5x | floor: matrix products "
             "alone (ms) | the most any cell could gain over TorchRL |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        build, base_a, base_b, ours = WORKLOADS[r["workload"]]
        bases = [b for b in (base_a, base_b) if b is not None]
        best = min(bases, key=lambda b: r["ms"][b])
        size = (f"B={ROLLOUT_B}, {ROLLOUT_STEPS} steps" if r["workload"] == "imagination" else f"B={r['B']}, T={r['T']}")
        lines.append(f"| {r['workload']} | {r['shape']} ({size}, F=H=P={r['F']}, {r['nb']} blocks) | "
                     f"{r['threads']} | {r['ms'][best]} ({best.removeprefix('torchrl ')}) | {r['ms'][ours]} | "
                     f"{r['speedup']}x | {'met' if r['met'] else 'missed'} | " + _floor(r, best))
    return "\n".join(lines)


def _floor(row: dict, best: str) -> str:
    """The floor's cells of a row (``-`` in a row measured before it was timed)."""
    floor = row["ms"].get(FLOOR)
    return "- | - |" if floor is None else f"{floor} | {round(row['ms'][best] / floor, 2)}x |"


def section(doc: dict) -> str:
    env = doc["environment"]
    return (f"{BEGIN}\n\n{table(doc)}\n\nMeasured on {env.get('device_name', 'CPU')} ({env.get('cpu_count')} cores), torch {env.get('torch')}, fwd+bwd, "
            f"{int(doc['reset_probability'] * 100)}% resets; median of interleaved rounds. Eager `torchrl` is the "
            f"faster of its `reference` and `scan` backends. Regenerate with "
            f"`python benchmarks/bench_block_gru.py && python benchmarks/bench_block_gru.py --report`.\n\n{END}")


def report(path: Path) -> None:
    write_section(PAGE, BEGIN, END, section(json.loads(path.read_text())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="write the docs table from the results JSON")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few rounds (a smoke run)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    doc = run(QUICK if args.quick else SHAPES, args.threads, 2 if args.quick else 7, args.workloads)
    if args.out.exists() and set(args.workloads) != set(WORKLOADS):  # a partial run: keep the other workloads' rows
        old = json.loads(args.out.read_text())
        kept = [r for r in old["rows"] if r["workload"] not in args.workloads]
        envs = {k: v for k, v in old.items() if k.endswith("_rows_environment")
                and k.removesuffix("_rows_environment") not in args.workloads}
        for workload in args.workloads:
            envs[f"{workload}_rows_environment"] = doc["environment"]
        order = [*SHAPES, *QUICK], list(WORKLOADS)  # the rows in the order a whole run writes them
        rows = sorted(kept + doc["rows"], key=lambda r: (order[0].index(r["shape"]), order[1].index(r["workload"]),
                                                          r["threads"]))
        doc = {**doc, "environment": old["environment"], "rows": rows, **envs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
