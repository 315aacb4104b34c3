"""The acting step of a recurrent policy: ``torch.compile(module, fullgraph=True)`` vs eager vs a bare cell.

    python benchmarks/bench_policy_step.py [--threads 1] [--repeats 40] [--inner 100]

What a collector pays per environment step: one call of our ``LSTMModule`` / ``GRUModule`` in
sequential mode on a fresh ``[B]`` TensorDict (input, hidden state ``[B, L, H]``, ``is_init``
``[B, 1]`` True for ~5% of rows), under ``torch.no_grad``. B=32, F=64, H=128, L=1 (the step shape
of ``bench_modules.py``). Contenders, all sharing the same weights and inputs, timed in one
process, interleaved in rotating rounds (``_timing.interleaved``); each sample is ``--inner``
calls and the per-call time is reported (median over rounds, and the minimum):

* ``eager module``: ``module(td)``.
* ``compiled module``: ``policy = torch.compile(module, fullgraph=True); policy(td)`` (Inductor):
  what the user writes.
* ``compiled module, skip_guard_eval_unsafe``: the same compiled module called inside
  ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (guards are not re-checked: unsafe
  if anything they check changes; see docs/compile.md, "Policy step").
* ``compiled module, cpp_wrapper``: ``torch.compile(module, fullgraph=True, options={"cpp_wrapper":
  True})``: Inductor's C++ wrapper runs the graph's kernels from C++ instead of a Python function
  (a per-compile option, no global config; see docs/compile.md, "Policy step"). Its compiled code
  shares the forward's Dynamo cache with ``compiled module`` (two entries, one per backend; the
  default's is looked up first).
* ``compiled step function (tensors)``: ``torch.compile(lstm_step, fullgraph=True)`` on the
  tensors, no TensorDict and no module: what TensorDict and the module add on top of the math.
* ``TensorDict construction``: building the fresh input TensorDict alone (part of both module rows).
* ``nn.LSTMCell`` / ``nn.GRUCell``: the bare ``torch.nn`` cell on tensors, no reset, no TensorDict
  (the floor).

Each contender also records the thread CPU time of its samples (``cpu_median_us_per_call`` and its
ratios): the machine's other jobs inflate wall-clock samples when they preempt this process, not
CPU time (with one torch thread every op runs on the calling thread).

``--breakdown`` also splits the compiled module's call into measured parts (torch 2.13 internals:
Dynamo's cache entry of the forward, the graph function it calls, Inductor's compiled graph),
each timed by calling that piece alone, interleaved like the contenders: Inductor's graph code
(``call``: GEMMs and fused kernels), with Inductor's ``CompiledFxGraph`` wrapper, the forward's
transformed bytecode without guards (reads the TensorDict, calls the graph through the AOT runtime
wrappers, replays the TensorDict writes),
the guard check and the rest (the ``nn.Module``/``OptimizedModule`` call path and Dynamo's frame
entry). Stored under ``breakdown`` in the JSON.

Run it from the repository root with ``PYTHONPATH=.`` so that ``import rnn_functional`` reads the
checkout, not an installed copy. Writes ``results/policy_step_cpu.json`` and prints a Markdown table
(ratios to the eager module and to the bare cell).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, repeated_no_grad  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = {"B": 32, "F": 64, "H": 128, "L": 1, "reset_prob": 0.05}
MODULES = {"lstm": (rf.LSTMModule, nn.LSTMCell, rf.lstm_step), "gru": (rf.GRUModule, nn.GRUCell, rf.gru_step)}


def setup(cell: str):
    """The policy step's module, its inputs (``x`` [B, F], states [B, L, H] each, ``is_init`` [B, 1]),
    a fresh-TensorDict factory, and the bare ``torch.nn`` cell on the same weights with its state."""
    module_cls, cell_cls, _ = MODULES[cell]
    B, F, H, L = (SHAPE[k] for k in ("B", "F", "H", "L"))
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    module = module_cls(F, H, L, in_key="x", out_key="y")
    hidden_keys = module.in_keys[1:-1]
    x = torch.randn(B, F, generator=g)
    states = [torch.randn(B, L, H, generator=g) for _ in hidden_keys]
    is_init = torch.rand(B, 1, generator=g) < SHAPE["reset_prob"]
    bare = cell_cls(F, H)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(bare, name).copy_(module._weights[f"{name}_l0"])
    bare_state = tuple(s[:, 0] for s in states)
    bare_state = bare_state if cell == "lstm" else bare_state[0]

    def make_td() -> TensorDict:
        return TensorDict({"x": x, **dict(zip(hidden_keys, states)), "is_init": is_init}, [B])

    return module, x, states, is_init, make_td, bare, bare_state


def contenders(cell: str, inner: int, cpu_times: dict[str, list[float]]) -> dict:
    """name -> zero-argument callable running ``inner`` calls of that contender; each run appends its
    thread CPU time to ``cpu_times[name]``."""
    _, cell_cls, step_fn = MODULES[cell]
    module, x, states, is_init, make_td, bare, bare_state = setup(cell)
    core_state = tuple(states) if cell == "lstm" else states[0]
    params = dict(module._weights)

    def step(x, state, params, is_init):
        return step_fn(x, state, params, is_init=is_init)

    compiled_module = torch.compile(module, fullgraph=True)
    cpp_wrapped = torch.compile(module, fullgraph=True, options={"cpp_wrapper": True})
    compiled_step = torch.compile(step, fullgraph=True)
    with torch.no_grad():  # same results before timing
        want = module(make_td())["y"]
        # compiled last, the default's cache entry is the forward's first: the cpp_wrapper row pays the lookup
        torch.testing.assert_close(cpp_wrapped(make_td())["y"], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled_module(make_td())["y"], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled_step(x, core_state, params, is_init)[0], want, rtol=1e-5, atol=1e-6)

    def repeat(name: str, fn, stance: dict | None = None):
        def run():
            with torch.no_grad(), torch.compiler.set_stance(**(stance or {"stance": "default"})):
                t0 = time.thread_time()
                for _ in range(inner):
                    fn()
                cpu_times.setdefault(name, []).append(time.thread_time() - t0)
        return run

    calls = {
        "eager module": (lambda: module(make_td()), None),
        "compiled module": (lambda: compiled_module(make_td()), None),
        "compiled module, skip_guard_eval_unsafe": (lambda: compiled_module(make_td()), {"skip_guard_eval_unsafe": True}),
        "compiled module, cpp_wrapper": (lambda: cpp_wrapped(make_td()), None),
        "compiled step function (tensors)": (lambda: compiled_step(x, core_state, params, is_init), None),
        "TensorDict construction": (make_td, None),
        f"nn.{cell_cls.__name__} (tensors, no reset)": (lambda: bare(x, bare_state), None),
    }
    return {name: repeat(name, fn, stance) for name, (fn, stance) in calls.items()}


def breakdown(cell: str, inner: int, repeats: int) -> dict[str, float]:
    """Median us per call of the compiled module and of each piece it runs (see the module docstring)."""
    import types

    from torch._inductor.output_code import CompiledFxGraph

    module, x, _, _, make_td, bare, bare_state = setup(cell)

    torch._dynamo.reset()  # one cache entry on the forward: this policy's
    policy = torch.compile(module, fullgraph=True)
    captured = {}
    original_call = CompiledFxGraph.__call__

    def capture(graph, inputs):
        captured["graph"], captured["inputs"] = graph, list(inputs)
        return original_call(graph, inputs)

    with torch.no_grad():
        policy(make_td())
        CompiledFxGraph.__call__ = capture
        try:
            policy(make_td())
        finally:
            CompiledFxGraph.__call__ = original_call
    forward = type(module).forward
    (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(forward.__code__)
    transformed = types.FunctionType(entry.code, forward.__globals__)  # the forward Dynamo runs, guards aside
    graph, inputs = captured["graph"], captured["inputs"]

    def guarded():
        td = make_td()
        entry.guard_manager.check({"self": module, "args": (td,), "kwargs": {}})
        return transformed(module, td)

    calls = {
        "bare cell": lambda: bare(x, bare_state),
        "TensorDict construction": make_td,
        "Inductor graph code": lambda: graph.current_callable(list(inputs)),
        "Inductor graph with its CompiledFxGraph wrapper": lambda: graph(list(inputs)),
        "forward bytecode, no guards (+ TensorDict construction)": lambda: transformed(module, make_td()),
        "guard check + forward bytecode (+ TensorDict construction)": guarded,
        "compiled module (+ TensorDict construction)": lambda: policy(make_td()),
    }

    res = interleaved({n: repeated_no_grad(fn, inner) for n, fn in calls.items()}, torch.device("cpu"), repeats=repeats, max_seconds=60)
    return {n: r["median_s"] / inner * 1e6 for n, r in res.items()}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--repeats", type=int, default=40, help="timed rounds")
    ap.add_argument("--inner", type=int, default=100, help="calls per timed sample")
    ap.add_argument("--cells", nargs="+", default=["lstm", "gru"], choices=list(MODULES))
    ap.add_argument("--out", type=Path, default=RESULTS / "policy_step_cpu.json")
    ap.add_argument("--breakdown", action="store_true", help="also time the parts of the compiled module's call")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    report = {"environment": environment(device), "shape": SHAPE, "inner_calls": args.inner, "cells": {}}
    for cell in args.cells:
        cpu_times: dict[str, list[float]] = {}
        res = interleaved(contenders(cell, args.inner, cpu_times), device, repeats=args.repeats, max_seconds=120)
        for name, r in res.items():
            for k in ("median_s", "min_s"):
                if k in r:
                    r[k.replace("_s", "_us_per_call")] = r.pop(k) / args.inner * 1e6
            r.pop("first_call_s", None)
            timed = cpu_times.get(name, [])[-r.get("samples", 0):] if "samples" in r else []  # the timed rounds
            if timed:
                r["cpu_median_us_per_call"] = statistics.median(timed) / args.inner * 1e6
        eager, floor = res["eager module"], next(r for n, r in res.items() if n.startswith("nn."))
        for r in res.values():
            if "median_us_per_call" in r:
                r["x_eager_module"] = r["median_us_per_call"] / eager["median_us_per_call"]
                r["x_bare_cell"] = r["median_us_per_call"] / floor["median_us_per_call"]
                r["cpu_x_eager_module"] = r["cpu_median_us_per_call"] / eager["cpu_median_us_per_call"]
                r["cpu_x_bare_cell"] = r["cpu_median_us_per_call"] / floor["cpu_median_us_per_call"]
        report["cells"][cell] = res
        if args.breakdown:
            report.setdefault("breakdown", {})[cell] = breakdown(cell, args.inner, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))

    env = report["environment"]
    print(f"policy step, {SHAPE}, no grad, {env['torch_threads']} thread(s), load {env['load_average_1m']:.1f}; "
          f"us per call: median (min)")
    print("| cell | contender | us/call | x eager module | x bare cell | CPU us/call | CPU x eager | CPU x bare |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")
    for cell, res in report["cells"].items():
        for n, r in res.items():
            if "median_us_per_call" in r:
                print(f"| {cell.upper()} | {n} | {r['median_us_per_call']:.1f} ({r['min_us_per_call']:.1f}) | "
                      f"{r['x_eager_module']:.2f} | {r['x_bare_cell']:.2f} | {r['cpu_median_us_per_call']:.1f} | "
                      f"{r['cpu_x_eager_module']:.2f} | {r['cpu_x_bare_cell']:.2f} |")
            else:
                print(f"| {cell.upper()} | {n} | {r['error']} | | | | | |")
    for cell, parts in report.get("breakdown", {}).items():
        print(f"{cell.upper()} breakdown, us per call: " + "; ".join(f"{n}: {t:.1f}" for n, t in parts.items()))
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
