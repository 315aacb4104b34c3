"""Per-call cost of our functions and modules next to their baselines, side by side in one process.

    PYTHONPATH=. python benchmarks/bench_per_call.py            # all rows, 1 and 2 threads (2-3 min)
    PYTHONPATH=. python benchmarks/bench_per_call.py --quick --out /tmp/per_call.json   # smoke run
    python benchmarks/bench_per_call.py --report                # table + docs section from the JSON

Every row is one of ours against one baseline, on the same weights and inputs, under
``torch.no_grad``, at ``torch.set_num_threads(1)`` and at 2 (each thread count its own row). The
contenders of a group are timed in rotating interleaved rounds (``_timing.interleaved``); each sample
is ``inner`` calls and the per-call time is reported (median over rounds, and the minimum). A row
records its ratio of medians (ours / baseline) and difference of medians (us), the target that
applies (to the ratio, or to the difference for the tiny sequence rows) and whether it is met.

Groups (``--groups``), each for LSTM and GRU (``--cells``):

* ``step``: ``lstm_step`` / ``gru_step`` (B=32, F=64, H=128; state ``[B, 1, H]`` each, params from
  ``init_lstm_params`` / ``init_gru_params`` as returned, ``is_init`` bool ``[B]`` True for ~10% of
  rows) vs the bare ``nn.LSTMCell`` / ``nn.GRUCell`` on ``[B, H]`` states (no reset: the floor).
  Target: ratio <= 1.3.
* ``module``: ``LSTMModule`` / ``GRUModule`` in step mode (sequential, the default) on a ``[B]``
  TensorDict with the module's default keys (``in_key``, TorchRL's hidden-state keys, ``is_init``
  ``[B, 1]``), the same TensorDict every call (as a collector's shuttle), vs the same bare cell.
  Target: ratio <= 1.6.
* ``policy``: a whole policy step, ``TensorDictSequential(TensorDictModule(Linear(F, 128), Tanh),
  our module (128 -> 128), TensorDictModule(Linear(128, A)))``, B=32: ``torch.compile(policy,
  fullgraph=True)`` (Inductor, compiled and warmed up before timing, recompiles turned into errors)
  vs the same policy eager. Each call gets a fresh ``[B]`` TensorDict (input, hidden states,
  ``is_init``), built before the timed loop: the rows time the call, not the construction.
  Target: ratio <= 0.8. Compiled again at each thread count (Inductor's CPU kernels specialise on it).
* ``tiny``: a sequence call with B=1, T=1, F=64, H=128: ``lstm_sequence(x, None, params)`` and our
  module in recurrent mode (``with rf.set_recurrent_mode(True)``, entered once per sample; a
  ``[1, 1]`` TensorDict with the input and ``is_init`` False, no hidden states: zeros) vs
  ``nn.LSTM(F, H, batch_first=True)(x)`` (same for GRU). Targets on the difference of medians:
  function <= baseline + 20 us, module <= baseline + 50 us.
* ``recurrent``: our module in recurrent mode on a ``[B, T]`` TensorDict (B=32, T=64, F=64, H=128,
  stored hidden states ``[B, T, 1, H]``, ``is_init`` True at t=0 and ~3% elsewhere) vs the function
  it wraps called the way the module calls it (``lstm_sequence(x, first states, params,
  is_init=..., reset_state=stored states, return_segment_states=True)``), its results held until the
  next call replaces them, as the module's stay in the TensorDict (both keep two calls' outputs alive at
  once: the 1 MB outputs otherwise meet the C library's heap differently, a few % either way).
  Target: ratio <= 1.03.

Before timing, every contender's output is checked against its baseline's. Writes
``results/per_call_cpu.json`` (``--out``) and prints the table; ``--report`` (no timing) prints it
and rewrites the generated section of ``docs/benchmarks.md`` (``--doc``) from the JSON.
Run it on a quiet machine: other jobs on the cores inflate every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _timing import environment, interleaved, write_section  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = HERE / "results"
DOC_PAGE = HERE.parent / "docs" / "benchmarks.md"
BEGIN = "<!-- BEGIN GENERATED (benchmarks/bench_per_call.py --report) -->"
END = "<!-- END GENERATED (benchmarks/bench_per_call.py --report) -->"

SHAPES = {
    "step": {"B": 32, "F": 64, "H": 128, "reset_prob": 0.10},
    "policy": {"B": 32, "F": 64, "E": 128, "H": 128, "A": 8, "reset_prob": 0.10},
    "tiny": {"B": 1, "T": 1, "F": 64, "H": 128},
    "recurrent": {"B": 32, "T": 64, "F": 64, "H": 128, "reset_prob": 0.03},
}
TARGETS = {  # group -> (metric, ours row label -> target)
    "step": ("ratio", 1.3),
    "module": ("ratio", 1.6),
    "policy": ("ratio", 0.8),
    "tiny function": ("diff_us", 20.0),
    "tiny module": ("diff_us", 50.0),
    "recurrent": ("ratio", 1.03),
}
GROUPS = ["step", "module", "policy", "tiny", "recurrent"]
# calls per timed sample (default run; --quick divides them): each sample ~10-30 ms on one core
INNER = {"step": 100, "policy": 50, "tiny": 200, "recurrent": 5}
CELLS = {
    "lstm": {"step": rf.lstm_step, "sequence": rf.lstm_sequence, "init": rf.init_lstm_params,
             "module": rf.LSTMModule, "cell": nn.LSTMCell, "rnn": nn.LSTM, "child": "lstm", "states": 2},
    "gru": {"step": rf.gru_step, "sequence": rf.gru_sequence, "init": rf.init_gru_params,
            "module": rf.GRUModule, "cell": nn.GRUCell, "rnn": nn.GRU, "child": "gru", "states": 1},
}
PARAM_NAMES = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
TOL = {"rtol": 1e-4, "atol": 1e-5}


# ----------------------------------------------------------------------------------------------- timing

class Timed:
    """A contender: ``inner`` calls of ``call`` per sample, timed inside the sample (perf_counter).

    ``interleaved`` runs the samples (warm-up, rotating rounds); the time of each is taken here so that
    the untimed part stays out: building ``setup()`` arguments (one per call, before the loop) and
    entering ``torch.no_grad`` and ``context``.
    """

    def __init__(self, call: Callable, inner: int, setup: Callable | None = None, context: Callable | None = None):
        self.call, self.inner, self.setup, self.context = call, inner, setup, context
        self.samples: list[float] = []

    def __call__(self) -> None:
        call, inner = self.call, self.inner
        args = [self.setup() for _ in range(inner)] if self.setup is not None else None
        with torch.no_grad(), (self.context() if self.context is not None else nullcontext()):
            if args is None:
                t0 = time.perf_counter()
                for _ in range(inner):
                    call()
            else:
                t0 = time.perf_counter()
                for a in args:
                    call(a)
            self.samples.append(time.perf_counter() - t0)


def measure(contenders: dict[str, Timed], repeats: int, max_seconds: float) -> dict[str, dict]:
    """name -> ``{"median_us", "min_us", "samples"}`` per call (or ``{"error"}``), timed together."""
    res = interleaved(contenders, torch.device("cpu"), repeats=repeats, max_seconds=max_seconds)
    out = {}
    for name, r in res.items():
        if "error" in r:
            out[name] = {"error": r["error"]}
            continue
        c = contenders[name]
        per_call = [s / c.inner * 1e6 for s in c.samples[-r["samples"]:]]  # the timed rounds, not the warm-up
        out[name] = {"median_us": statistics.median(per_call), "min_us": min(per_call), "samples": len(per_call),
                     "inner": c.inner}
    return out


def make_row(group: str, target_key: str, cell: str, threads: int, name: str, ours: str, base: str,
             res: dict[str, dict], **extra) -> dict:
    """One result row: ours against base, the target of ``target_key`` and whether it is met."""
    metric, target = TARGETS[target_key]
    row = {"group": group, "name": name, "cell": cell, "threads": threads, "ours": ours, "baseline": base,
           "metric": metric, "target": target, **extra}
    o, b = res.get(ours, {}), res.get(base, {})
    if "median_us" not in o or "median_us" not in b:
        row.update(ours_us=None, ours_min_us=None, base_us=None, base_min_us=None, ratio=None, diff_us=None,
                   met=False, error="; ".join(f"{n}: {r['error']}" for n, r in ((ours, o), (base, b)) if "error" in r)
                   or "not measured")
        return row
    row.update(ours_us=o["median_us"], ours_min_us=o["min_us"], base_us=b["median_us"], base_min_us=b["min_us"],
               ratio=o["median_us"] / b["median_us"], diff_us=o["median_us"] - b["median_us"],
               samples=min(o["samples"], b["samples"]), inner=o["inner"])
    row["met"] = bool(row[metric] <= target)
    return row


# ----------------------------------------------------------------------------------------------- set-up

def _params(cell: str, F: int, H: int, seed: int):
    return CELLS[cell]["init"](F, H, generator=torch.Generator().manual_seed(seed))


def _load(target: nn.Module, params, *, cell: bool = False) -> None:
    """Copy ``params`` (``torch.nn.LSTM``/``GRU`` names) into ``target``: an ``nn.LSTM``/``nn.GRU``, or
    with ``cell=True`` an ``nn.LSTMCell``/``nn.GRUCell`` (names without ``_l0``)."""
    with torch.no_grad():
        for name in PARAM_NAMES:
            getattr(target, name.removesuffix("_l0") if cell else name).copy_(params[name])


def _module(cell: str, F: int, H: int, params, **keys) -> nn.Module:
    module = CELLS[cell]["module"](F, H, **keys)
    _load(getattr(module, CELLS[cell]["child"]), params)
    return module


def _hidden_keys(module) -> list:
    return list(module.in_keys[1:-1])


def _pack(cell: str, states: list[torch.Tensor]):
    return tuple(states) if cell == "lstm" else states[0]


def step_group(cell: str, threads: int, inner: int, repeats: int, max_seconds: float, groups: list[str]) -> list[dict]:
    """Rows ``step`` and ``module``: the step function and the step-mode module vs the bare cell."""
    spec, s = CELLS[cell], SHAPES["step"]
    B, F, H = s["B"], s["F"], s["H"]
    g = torch.Generator().manual_seed(0)
    params = _params(cell, F, H, 0)
    x = torch.randn(B, F, generator=g)
    states = [torch.randn(B, 1, H, generator=g) for _ in range(spec["states"])]
    is_init = torch.rand(B, generator=g) < s["reset_prob"]
    is_init[0] = True  # at least one reset
    bare = spec["cell"](F, H)
    _load(bare, params, cell=True)
    bare_state = _pack(cell, [st[:, 0] for st in states])
    module = _module(cell, F, H, params, in_key="observation", out_key="features")
    td = TensorDict({"observation": x, **dict(zip(_hidden_keys(module), states)), "is_init": is_init[:, None]}, [B])
    state = _pack(cell, states)
    step = spec["step"]

    with torch.no_grad():  # same results before timing: the bare cell on reset-masked states
        keep = (~is_init)[:, None].float()
        want = bare(x, _pack(cell, [st[:, 0] * keep for st in states]))
        want = want[0] if cell == "lstm" else want
        torch.testing.assert_close(step(x, state, params, is_init=is_init)[0], want, **TOL)
        torch.testing.assert_close(module(td.clone(False))["features"], want, **TOL)

    ours_step, ours_module, base = f"{cell}_step", f"{spec['module'].__name__} (step mode)", f"nn.{spec['cell'].__name__}"
    contenders = {base: Timed(lambda: bare(x, bare_state), inner)}
    if "step" in groups:
        contenders[ours_step] = Timed(lambda: step(x, state, params, is_init=is_init), inner)
    if "module" in groups:
        contenders[ours_module] = Timed(lambda: module(td), inner)
    res = measure(contenders, repeats, max_seconds)
    rows = []
    if "step" in groups:
        rows.append(make_row("step", "step", cell, threads, f"{ours_step} vs {base}", ours_step, base, res))
    if "module" in groups:
        rows.append(make_row("module", "module", cell, threads, f"{ours_module} vs {base}", ours_module, base, res))
    return rows


def policy_group(cell: str, threads: int, inner: int, repeats: int, max_seconds: float) -> list[dict]:
    """Row ``policy``: the compiled policy step vs the same policy eager, a fresh TensorDict per call."""
    spec, s = CELLS[cell], SHAPES["policy"]
    B, F, E, H, A = s["B"], s["F"], s["E"], s["H"], s["A"]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    rnn = _module(cell, E, H, _params(cell, E, H, 1), in_key="embed", out_key="features")
    policy = TensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(F, E), nn.Tanh()), in_keys=["observation"], out_keys=["embed"]),
        rnn,
        TensorDictModule(nn.Linear(H, A), in_keys=["features"], out_keys=["action"]),
    )
    x = torch.randn(B, F, generator=g)
    states = [torch.randn(B, 1, H, generator=g) for _ in range(spec["states"])]
    is_init = torch.rand(B, 1, generator=g) < s["reset_prob"]
    is_init[0] = True
    hidden = dict(zip(_hidden_keys(rnn), states))

    def fresh() -> TensorDict:
        return TensorDict({"observation": x, **hidden, "is_init": is_init}, [B])

    torch._dynamo.reset()  # compiled for this thread count
    compiled = torch.compile(policy, fullgraph=True)
    with torch.no_grad():
        want = policy(fresh())["action"]
        t0 = time.perf_counter()
        got = compiled(fresh())["action"]
        compile_s = time.perf_counter() - t0
        for _ in range(2):  # any second compile happens here, not in the timed rounds
            got = compiled(fresh())["action"]
        torch.testing.assert_close(got, want, **TOL)

    ours, base = f"compiled policy ({spec['module'].__name__})", f"eager policy ({spec['module'].__name__})"
    contenders = {
        ours: Timed(lambda td: compiled(td), inner, setup=fresh),
        base: Timed(lambda td: policy(td), inner, setup=fresh),
    }
    with torch._dynamo.config.patch(error_on_recompile=True):
        res = measure(contenders, repeats, max_seconds)
    return [make_row("policy", "policy", cell, threads, f"{ours} vs {base}", ours, base, res,
                     compile_s=compile_s)]


def tiny_group(cell: str, threads: int, inner: int, repeats: int, max_seconds: float) -> list[dict]:
    """Rows ``tiny``: a B=1, T=1 sequence call, function and recurrent-mode module, vs ``nn.LSTM``/``nn.GRU``."""
    spec, s = CELLS[cell], SHAPES["tiny"]
    B, T, F, H = s["B"], s["T"], s["F"], s["H"]
    g = torch.Generator().manual_seed(2)
    params = _params(cell, F, H, 2)
    x = torch.randn(B, T, F, generator=g)
    rnn = spec["rnn"](F, H, batch_first=True)
    _load(rnn, params)
    module = _module(cell, F, H, params, in_key="observation", out_key="features")
    td = TensorDict({"observation": x, "is_init": torch.zeros(B, T, 1, dtype=torch.bool)}, [B, T])
    sequence = spec["sequence"]

    with torch.no_grad():
        want = rnn(x)[0]
        torch.testing.assert_close(sequence(x, None, params)[0], want, **TOL)
        with rf.set_recurrent_mode(True):
            torch.testing.assert_close(module(td.clone(False))["features"], want, **TOL)

    fn, mod, base = f"{cell}_sequence", f"{spec['module'].__name__} (recurrent mode)", f"nn.{spec['rnn'].__name__}"
    res = measure({
        fn: Timed(lambda: sequence(x, None, params), inner),
        mod: Timed(lambda: module(td), inner, context=lambda: rf.set_recurrent_mode(True)),
        base: Timed(lambda: rnn(x), inner),
    }, repeats, max_seconds)
    label = f"B={B} T={T}"
    return [make_row("tiny", "tiny function", cell, threads, f"{fn} {label} vs {base}", fn, base, res),
            make_row("tiny", "tiny module", cell, threads, f"{mod} {label} vs {base}", mod, base, res)]


def recurrent_group(cell: str, threads: int, inner: int, repeats: int, max_seconds: float) -> list[dict]:
    """Row ``recurrent``: the module in recurrent mode on ``[B, T]`` vs the sequence function it wraps."""
    spec, s = CELLS[cell], SHAPES["recurrent"]
    B, T, F, H = s["B"], s["T"], s["F"], s["H"]
    g = torch.Generator().manual_seed(3)
    params = _params(cell, F, H, 3)
    module = _module(cell, F, H, params, in_key="observation", out_key="features")
    x = torch.randn(B, T, F, generator=g)
    stored = [0.5 * torch.randn(B, T, 1, H, generator=g) for _ in range(spec["states"])]  # a rollout's states
    is_init = torch.rand(B, T, generator=g) < s["reset_prob"]
    is_init[:, 0] = True
    keys = _hidden_keys(module)
    td = TensorDict({"observation": x, **dict(zip(keys, stored)), "is_init": is_init[..., None]}, [B, T])
    first = _pack(cell, [st[:, 0] for st in stored])
    resets = _pack(cell, stored)
    sequence = spec["sequence"]

    held = {}

    def function():  # its results kept until the next call's replace them, as the module's stay in the TensorDict
        held["out"] = sequence(x, first, params, is_init=is_init, reset_state=resets, return_segment_states=True)
        return held["out"]

    with torch.no_grad():
        y, _, segments = function()
        with rf.set_recurrent_mode(True):
            out = module(td.clone(False))
        torch.testing.assert_close(out["features"], y, **TOL)
        for key, seg in zip(keys, segments if cell == "lstm" else (segments,)):
            torch.testing.assert_close(out["next", key], seg, **TOL)

    mod, fn = f"{spec['module'].__name__} (recurrent mode)", f"{cell}_sequence"
    res = measure({
        mod: Timed(lambda: module(td), inner, context=lambda: rf.set_recurrent_mode(True)),
        fn: Timed(function, inner),
    }, repeats, max_seconds)
    return [make_row("recurrent", "recurrent", cell, threads, f"{mod} [{B}, {T}] vs {fn}", mod, fn, res)]


# ----------------------------------------------------------------------------------------------- report

def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(doc: dict) -> str:
    """Markdown: one row per measured pair, in run order."""
    lines = ["| row | cell | threads | ours | baseline | ours us | baseline us | ours / baseline | difference us | target | met |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---|---|"]
    for r in doc["rows"]:
        target = f"ratio <= {r['target']:g}" if r["metric"] == "ratio" else f"difference <= {r['target']:g} us"
        if r["ours_us"] is None:
            met = f"error: {r.get('error', '')[:120]}"
            ours = base = ratio = diff = "-"
        else:
            met = "yes" if r["met"] else "**no**"
            ours = f"{_us(r['ours_us'])} ({_us(r['ours_min_us'])})"
            base = f"{_us(r['base_us'])} ({_us(r['base_min_us'])})"
            ratio, diff = f"{r['ratio']:.2f}", f"{r['diff_us']:+.1f}"
        lines.append(f"| {r['group']} | {r['cell'].upper()} | {r['threads']} | {r['ours']} | {r['baseline']} | "
                     f"{ours} | {base} | {ratio} | {diff} | {target} | {met} |")
    return "\n".join(lines)


def section(doc: dict) -> str:
    """The generated section of ``docs/benchmarks.md`` (markers included) for the results ``doc``."""
    env, settings = doc["environment"], doc["settings"]
    timed = [r for r in doc["rows"] if r["ours_us"] is not None]
    met = sum(r["met"] for r in timed)
    compiles = [f"{r['cell'].upper()} {r['threads']} thread(s) {r['compile_s']:.0f} s"
                for r in doc["rows"] if r.get("compile_s") is not None]
    load = env.get("load_average_1m")
    return (
        f"{BEGIN}\n\n### Per-call cost against torch.nn and eager (`bench_per_call.py`)\n\n"
        f"Each row: one of ours against its baseline, same weights and inputs, `torch.no_grad`, timed "
        f"interleaved in one process at the torch thread count of the row; us per call: median over "
        f"{settings['repeats']} rounds (min), ratio and difference of the medians. Shapes: "
        + "; ".join(f"{k}: " + ", ".join(f"{n}={v}" for n, v in s.items()) for k, s in settings["shapes"].items())
        + ". Calls per sample: " + ", ".join(f"{k} {v}" for k, v in settings["inner"].items())
        + f"{' (--quick)' if settings['quick'] else ''}. {env['device_name']} ({env['cpu_count']} cores"
        + (f", 1-min load average {load:.1f} at the start" if load is not None else "")
        + f"); torch {env['torch']}, tensordict {env['tensordict']}; {env['date']}. "
        f"Targets met: {met} of {len(doc['rows'])} rows.\n\n{table(doc)}\n\n"
        + (f"Compilation of the policy (first call): {'; '.join(compiles)}.\n\n" if compiles else "")
        + "```bash\nPYTHONPATH=. python benchmarks/bench_per_call.py   # writes benchmarks/results/per_call_cpu.json\n"
        "python benchmarks/bench_per_call.py --report          # this section\n```\n\n"
        f"{END}"
    )


def report(path: Path, doc_page: Path) -> None:
    """Print the table and rewrite the generated section of ``doc_page`` from the JSON at ``path``."""
    doc = json.loads(path.read_text())
    print(table(doc))
    write_section(doc_page, BEGIN, END, section(doc))
    print(f"wrote {doc_page}")


# ----------------------------------------------------------------------------------------------- main

def run(threads: list[int], cells: list[str], groups: list[str], repeats: int, inner: dict[str, int],
        max_seconds: float, quick: bool) -> dict:
    """Measure every group at every thread count; the results document."""
    environment_at_start = environment(torch.device("cpu"))
    rows: list[dict] = []
    saved = torch.get_num_threads()
    try:
        for n in threads:
            torch.set_num_threads(n)
            for cell in cells:
                if "step" in groups or "module" in groups:
                    rows += step_group(cell, n, inner["step"], repeats, max_seconds, groups)
                if "policy" in groups:
                    rows += policy_group(cell, n, inner["policy"], repeats, max_seconds)
                if "tiny" in groups:
                    rows += tiny_group(cell, n, inner["tiny"], repeats, max_seconds)
                if "recurrent" in groups:
                    rows += recurrent_group(cell, n, inner["recurrent"], repeats, max_seconds)
                print(f"threads={n} {cell}: done", flush=True)
    finally:
        torch.set_num_threads(saved)
    environment_at_start["torch_threads"] = threads  # each row's own count is in the row
    return {
        "environment": environment_at_start,
        "settings": {"threads": threads, "cells": cells, "groups": groups, "repeats": repeats, "inner": inner,
                     "quick": quick, "shapes": SHAPES,
                     "targets": {k: {"metric": m, "target": t} for k, (m, t) in TARGETS.items()}},
        "rows": rows,
        "summary": {"rows": len(rows), "met": sum(r["met"] for r in rows),
                    "not_met": [f"{r['name']} ({r['threads']} thread(s))" for r in rows if not r["met"]]},
    }


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts, a row each")
    ap.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    ap.add_argument("--groups", nargs="+", choices=GROUPS, default=GROUPS)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 40; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="a few short rounds (smoke test; numbers mean little)")
    ap.add_argument("--out", type=Path, default=RESULTS / "per_call_cpu.json", help="results JSON")
    ap.add_argument("--report", action="store_true", help="no timing: table and docs section from --out")
    ap.add_argument("--doc", type=Path, default=DOC_PAGE, help="docs page --report rewrites")
    args = ap.parse_args(argv)
    if args.report:
        report(args.out, args.doc)
        return args.out
    repeats = args.repeats or (3 if args.quick else 40)
    inner = {k: max(1, v // 25) if args.quick else v for k, v in INNER.items()}
    doc = run(args.threads, args.cells, args.groups, repeats, inner, 5.0 if args.quick else 60.0, args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"targets met: {doc['summary']['met']} of {doc['summary']['rows']}; wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
