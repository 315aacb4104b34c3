"""How close ``auto``'s eager route comes to the fastest route a caller can force, on densely reset ``[B, T]`` calls.

    python benchmarks/bench_auto_routes.py [--batch 256] [--steps 256] [--threads 1 2] [--reset-probs ...] [--repeats 3]

For the LSTM and the GRU (one layer, H=128, F=64), training calls (inputs and weights require grad; forward and
``y.sum().backward()``) and ``torch.no_grad`` calls, at each reset probability (every row also starts at
``t = 0``): ``auto`` and every route it picks among, forced (``reference`` and ``scan`` over the rows or over
right-aligned segments, ``pad`` over the packed segments or over length buckets), interleaved in random order,
the fastest of the rounds each; a route over 3x slower than the fastest in a first call each is shown (in
parentheses) by that call, and not timed further. Prints and writes (``results/auto_routes_cpu.json``) the
route ``auto`` took (``sequence_route``) and the forced time of that route over the fastest forced route's:
the cost table's (``rnn_functional/backends/costs.py``) ranking, measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rnn_functional, not an installed one
from _timing import environment, interleaved, write_json  # noqa: E402

import rnn_functional as rf  # noqa: E402
from rnn_functional.backends import LAYOUTS_OF  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
F_IN, HIDDEN = 64, 128
CELLS = {"lstm": (rf.init_lstm_params, rf.lstm_sequence), "gru": (rf.init_gru_params, rf.gru_sequence)}
# the eager routes ``auto`` weighs for these calls (``slices`` needs whole slices of one length, which these are not)
ROUTES = {f"{backend}/{layout}": (backend, layout) for backend in ("reference", "scan", "pad")
          for layout in LAYOUTS_OF[backend] if layout != "slices"}
PRUNE = 3.0


def measure(cell: str, batch: int, steps: int, prob: float, grad: bool, repeats: int) -> dict:
    """One configuration: the route ``auto`` takes and the fastest time of it and of each forced route."""
    g = torch.Generator().manual_seed(0)
    init, sequence = CELLS[cell]
    params = init(F_IN, HIDDEN, generator=g)
    if grad:
        params = {k: v.requires_grad_(True) for k, v in params.items()}
    x = torch.randn(batch, steps, F_IN, generator=g, requires_grad=grad)
    is_init = torch.rand(batch, steps, generator=g) < prob
    is_init[:, 0] = True

    def call(backend: str, layout: str):
        if grad:
            return lambda: sequence(x, None, params, is_init=is_init, backend=backend, segment_layout=layout)[0].sum().backward()

        def no_grad():
            with torch.no_grad():
                sequence(x, None, params, is_init=is_init, backend=backend, segment_layout=layout)
        return no_grad

    route = rf.sequence_route(cell, x, params, is_init=is_init, records_grad=grad)
    chosen = f"{route.backend}/{route.segments}"
    calls = {"auto": call("auto", "auto"), **{name: call(*how) for name, how in ROUTES.items()}}
    once = {name: _seconds(fn) for name, fn in calls.items()}
    fastest = min(once[name] for name in ROUTES)
    # a route this much slower than the fastest in one call each is not a contender (aligned segments of a densely
    # reset call: 10-30x), and timing it in every round would take most of the run; auto's route is always timed
    timed = {name: fn for name, fn in calls.items() if name in ("auto", chosen) or once[name] <= PRUNE * fastest}
    times = interleaved(timed, torch.device("cpu"), warmup=1, repeats=repeats, shuffle=True)
    best = min(times[name]["min_s"] for name in ROUTES if name in times)
    return {"cell": cell, "mode": "fwd+bwd" if grad else "fwd", "reset_prob": prob, "auto_route": chosen,
            "min_ms": {name: round(t["min_s"] * 1e3, 2) for name, t in times.items()},
            "untimed_once_ms": {name: round(once[name] * 1e3, 2) for name in calls if name not in times},
            "auto_route_over_fastest": round(times[chosen]["min_s"] / best, 3)}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def table(rows: list[dict]) -> str:
    """Markdown: one line per configuration."""
    out = ["| threads | cell | mode | resets | auto's route | " + " | ".join(f"{n} ms" for n in ROUTES)
           + " | auto's route / fastest |", "|---|---|---|---:|---|" + "---:|" * (len(ROUTES) + 1)]
    for r in rows:
        out.append(f"| {r['threads']} | {r['cell']} | {r['mode']} | {r['reset_prob']:.0%} | {r['auto_route']} | "
                   + " | ".join(f"{r['min_ms'][n]:.1f}" if n in r["min_ms"] else f"({r['untimed_once_ms'][n]:.0f})"
                                for n in ROUTES) + f" | {r['auto_route_over_fastest']:.2f}x |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reset-probs", type=float, nargs="+", default=[0.01, 0.1, 0.3, 0.9])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "auto_routes_cpu.json")
    args = ap.parse_args(argv)
    env, rows = environment(torch.device("cpu")), []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for cell in CELLS:
            for grad in (True, False):
                for prob in args.reset_probs:
                    rows.append({"threads": threads, **measure(cell, args.batch, args.steps, prob, grad, args.repeats)})
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    write_json(args.out, {"environment": env, "shape": {"B": args.batch, "T": args.steps, "F": F_IN, "H": HIDDEN},
                          "rows": rows})
    print(table(rows))


if __name__ == "__main__":
    main()
