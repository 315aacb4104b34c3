"""torch.compile: compile time, compiled vs eager speed, CUDA-graph step latency, graph breaks.

    python benchmarks/bench_compile.py [--quick] [--device cpu|cuda]

One process, contenders interleaved (``_timing.interleaved``). Sections of the JSON
(``benchmarks/results/compile_<device>.json``):

* ``compile_time``: first-call seconds of ``torch.compile(lstm_sequence / gru_sequence,
  fullgraph=True)`` (Inductor, ``auto`` -> ``scan``) for T = 16, 64, 256, forward and
  forward+backward, with Inductor's on-disk caches off so every compile is cold. ``scan``
  traces the step once, so compile time should not grow with T (an unrolled loop would).
* ``speed``: compiled (Inductor) vs eager, median seconds per call: the step functions, the
  sequence functions (forward and forward+backward of ``y.sum()``, with resets), and a whole
  sequential-mode policy step ``TensorDictSequential(LSTMModule | GRUModule, MLP)``.
* ``kernel_floor``: how close the compiled sequence's forward+backward comes to the fused kernels:
  ``lstm_sequence`` / ``gru_sequence`` (B=32, T=64, F=64, H=128, 5% resets) compiled with the
  default ``recompute="none"`` (the backward consumes the gates saved by the forward),
  ``recompute="full"`` (the backward recomputes them) and ``"none"`` with Inductor's C++ wrapper
  (``options={"cpp_wrapper": True}``), next to ``torch.nn.LSTM`` / ``nn.GRU`` forward+backward
  on the same sizes without resets; plus the eager paths (``scan``'s Python time loop with its
  hand-written backward, ``reference``, ``auto``) on the same batch and on a flat re-batched case
  (64 rows of 64 steps, resets only at ``t = 0``). Ratios are to ``torch.nn`` in the same process.
* ``reduce_overhead``: per-step latency of that policy step compiled with
  ``mode="reduce-overhead"`` (CUDA graphs) next to the default mode and eager; CUDA only, else
  the reason it was skipped.
* ``graph_breaks``: ``torch._dynamo.explain`` of the same policies (sequential step, recurrent
  ``[B, T]`` batch, flat ragged batch) built from our modules and from TorchRL's
  ``LSTMModule``/``GRUModule`` with each ``recurrent_backend``: graph and break counts and the
  distinct break reasons. Not a test of TorchRL: a side-by-side record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SEQUENCE = {"lstm": rf.lstm_sequence, "gru": rf.gru_sequence}
STEP = {"lstm": rf.lstm_step, "gru": rf.gru_step}
INIT = {"lstm": rf.init_lstm_params, "gru": rf.init_gru_params}


def _is_init(B: int, T: int, p: float, device, gen) -> torch.Tensor:
    mask = torch.rand(B, T, generator=gen) < p
    mask[:, 0] = True
    return mask.to(device)


def _sequence_fn(cell: str, params):
    def fn(x, is_init):
        return SEQUENCE[cell](x, None, params, is_init=is_init)[0]

    return fn


def _fwd_bwd(fn, x, is_init) -> torch.Tensor:
    """Forward, then backward of ``y.sum()`` (outside the compiled region: Inductor compiles the
    backward graph on the first backward call)."""
    y = fn(x, is_init)
    y.sum().backward()
    return y


def compile_time(cells, lengths, B, F, H, device) -> list[dict]:
    """Cold first-call compile seconds of the sequence functions for each T."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for cell in cells:
        params = INIT[cell](F, H, device=device).apply(lambda t: t.requires_grad_())
        for backward in (False, True):
            for T in lengths:
                torch._dynamo.reset()
                x = torch.randn(B, T, F, generator=gen).to(device).requires_grad_(backward)
                is_init = _is_init(B, T, 0.05, device, gen)
                fn = _sequence_fn(cell, params)
                compiled = torch.compile(fn, fullgraph=True)
                call = (lambda f: _fwd_bwd(f, x, is_init)) if backward else (lambda f: f(x, is_init))
                with torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False), \
                        torch._functorch.config.patch(enable_autograd_cache=False):
                    t0 = time.perf_counter()
                    y = call(compiled)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    first = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    call(compiled)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    second = time.perf_counter() - t0
                y_ref = fn(x, is_init)
                rows.append({
                    "cell": cell, "T": T, "B": B, "F": F, "H": H, "pass": "fwd+bwd" if backward else "fwd",
                    "first_call_s": first, "second_call_s": second,
                    "max_abs_diff_vs_eager": float((y - y_ref).detach().abs().max()),
                })
                print(f"compile {cell} T={T} {rows[-1]['pass']}: {first:.1f} s", flush=True)
    return rows


def _policy(cell: str, lib: str, F: int, H: int, device, backend: str = "auto", python_based: bool = False):
    from torchrl.modules import MLP

    if lib == "ours":
        module_cls = rf.LSTMModule if cell == "lstm" else rf.GRUModule
    else:
        import torchrl.modules as trm

        module_cls = trm.LSTMModule if cell == "lstm" else trm.GRUModule
    torch.manual_seed(0)
    rnn = module_cls(input_size=F, hidden_size=H, in_key="obs", out_key="feat", device=device,
                     recurrent_backend=backend, python_based=python_based)
    head = TensorDictModule(MLP(in_features=H, out_features=2, num_cells=[H], device=device),
                            in_keys=["feat"], out_keys=["logits"])
    act = TensorDictModule(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return TensorDictSequential(rnn, head, act)


def _policy_input(cell: str, mode: str, B: int, T: int, F: int, H: int, device, seed: int = 0) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    shape = {"step": (B,), "batch": (B, T), "ragged": (B * T,)}[mode]
    if mode == "step":
        is_init = torch.arange(B) % 2 == 0
    else:
        is_init = _is_init(B, T, 0.1, "cpu", gen).reshape(shape)
    data = {"obs": torch.randn(*shape, F, generator=gen), "is_init": is_init.reshape(*shape, 1)}
    keys = ["recurrent_state_h", "recurrent_state_c"] if cell == "lstm" else ["recurrent_state"]
    for key in keys:
        data[key] = torch.zeros(*shape, 1, H)
    return TensorDict(data, batch_size=shape).to(device)


# calls per timed sample: sub-millisecond calls are repeated so that a sample is long enough
# not to be dominated by one preemption on a shared machine
INNER = {"step": 100, "sequence_fwd": 3, "sequence_fwd_bwd": 2, "policy_step": 50, "reduce_overhead": 100}


def _timed(contenders: dict, device, repeats: int, inner: int, warmup: int = 2) -> dict:
    """``interleaved`` timing with ``inner`` calls per sample; times reported per call.

    ``first_call_s`` stays the first warm-up sample as measured: the compile plus ``inner - 1`` calls.
    """

    def repeated(fn):
        def run():
            for _ in range(inner):
                out = fn()
            return out

        return run

    res = interleaved({k: repeated(f) for k, f in contenders.items()}, device, warmup=warmup, repeats=repeats)
    for stats in res.values():
        if "median_s" in stats:
            stats["median_s"] /= inner
            stats["min_s"] /= inner
            stats["calls_per_sample"] = inner
    return res


def speed(cells, B, T, F, H, device, repeats) -> dict:
    """Compiled (Inductor) vs eager: step, sequence (fwd, fwd+bwd) and policy step."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for cell in cells:
        params = INIT[cell](F, H, device=device).apply(lambda t: t.requires_grad_())
        x_step = torch.randn(B, F, generator=gen).to(device)
        init_step = (torch.arange(B) % 4 == 0).to(device)

        def step(x, is_init, cell=cell, params=params):
            with torch.no_grad():
                return STEP[cell](x, None, params, is_init=is_init)[0]

        x_seq = torch.randn(B, T, F, generator=gen).to(device).requires_grad_()
        init_seq = _is_init(B, T, 0.05, device, gen)
        fwd = _sequence_fn(cell, params)

        def no_grad(fn):
            def run(x, is_init):
                with torch.no_grad():
                    return fn(x, is_init)
            return run

        policy = _policy(cell, "ours", F, H, device)
        td = _policy_input(cell, "step", B, T, F, H, device)

        def policy_step(p):
            def run():
                with torch.no_grad():
                    return p(td.clone())
            return run

        compiled_step = torch.compile(step, fullgraph=True)
        compiled_fwd = torch.compile(no_grad(fwd), fullgraph=True)
        compiled_fwd_bwd = torch.compile(fwd, fullgraph=True)
        compiled_policy = torch.compile(policy, fullgraph=True)
        groups = {
            "step": {"eager": lambda: step(x_step, init_step), "compiled": lambda: compiled_step(x_step, init_step)},
            "sequence_fwd": {"eager": lambda: no_grad(fwd)(x_seq, init_seq),
                             "compiled": lambda: compiled_fwd(x_seq, init_seq)},
            "sequence_fwd_bwd": {"eager": lambda: _fwd_bwd(fwd, x_seq, init_seq),
                                 "compiled": lambda: _fwd_bwd(compiled_fwd_bwd, x_seq, init_seq)},
            "policy_step": {"eager": policy_step(policy), "compiled": policy_step(compiled_policy)},
        }
        for name, contenders in groups.items():
            res = _timed(contenders, device, repeats, INNER[name])
            if "median_s" in res.get("eager", {}) and "median_s" in res.get("compiled", {}):
                res["speedup_compiled_over_eager"] = res["eager"]["median_s"] / res["compiled"]["median_s"]
            out[f"{cell}_{name}"] = res
            print(f"speed {cell} {name}: " + ", ".join(
                f"{k} {v['median_s'] * 1e3:.2f} ms" for k, v in res.items() if isinstance(v, dict) and "median_s" in v
            ), flush=True)
    return {"B": B, "T": T, "F": F, "H": H, "reset_prob": 0.05, "results": out}


FLOOR_CONTENDERS = ("compiled", "compiled_recompute_full", "compiled_cpp_wrapper", "eager_scan", "eager_reference",
                    "eager_auto")


def kernel_floor(cell: str, B: int, T: int, F: int, H: int, device, repeats: int, contenders=FLOOR_CONTENDERS) -> dict:
    """Sequence fwd+bwd of ``y.sum()`` (5% resets; compiled and eager paths) next to ``torch.nn``'s
    fused fwd+bwd without resets, on ``[B, T]`` and on a flat re-batched ``[2B, T]`` (resets at ``t = 0``)."""
    torch.manual_seed(0)
    module = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(F, H, batch_first=True).to(device)
    params = rf.params_from_module(module)  # shares the module's storage
    gen = torch.Generator().manual_seed(2)
    cases = {
        f"batch_{B}x{T}_resets5pct": (B, _is_init(B, T, 0.05, device, gen)),
        f"flat_{2 * B}x{T}_rebatched": (2 * B, _is_init(2 * B, T, 0.0, device, gen)),
    }
    out = {"cell": cell, "B": B, "T": T, "F": F, "H": H, "cases": {}}
    for case, (rows, is_init) in cases.items():
        x = torch.randn(rows, T, F, generator=gen).to(device).requires_grad_()

        def seq(backend="auto", recompute="none"):
            def fn(x, is_init):
                return SEQUENCE[cell](x, None, params, is_init=is_init, backend=backend, recompute=recompute)[0]
            return fn

        def torch_nn():
            module(x)[0].sum().backward()

        compiled = {
            "compiled": lambda: torch.compile(seq(), fullgraph=True),
            "compiled_recompute_full": lambda: torch.compile(seq(recompute="full"), fullgraph=True),
            "compiled_cpp_wrapper": lambda: torch.compile(seq(), fullgraph=True, options={"cpp_wrapper": True}),
        }
        eager = {"eager_scan": seq("scan"), "eager_reference": seq("reference"), "eager_auto": seq("auto")}
        runs = {"torch_nn": torch_nn}
        for name in contenders:
            fn = compiled[name]() if name in compiled else eager[name]
            runs[name] = (lambda fn=fn: _fwd_bwd(fn, x, is_init))
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            res = _timed(runs, device, repeats, INNER["sequence_fwd_bwd"])
        base = res["torch_nn"].get("median_s")
        for name, stats in res.items():
            if base and "median_s" in stats:
                stats["ratio_to_torch_nn"] = stats["median_s"] / base
        out["cases"][case] = res
        print(f"floor {cell} {case}: " + ", ".join(
            f"{k} {v['median_s'] * 1e3:.2f} ms ({v['ratio_to_torch_nn']:.2f}x)" for k, v in res.items()
            if "median_s" in v), flush=True)
    return out


def reduce_overhead(cells, B, F, H, device, repeats) -> dict:
    """Sequential-mode policy step latency with CUDA graphs (CUDA only)."""
    if device.type != "cuda":
        return {"skipped": "mode='reduce-overhead' records CUDA graphs: needs a CUDA device, this run is on "
                           f"{device.type}"}
    out = {}
    for cell in cells:
        policy = _policy(cell, "ours", F, H, device)
        td = _policy_input(cell, "step", B, 1, F, H, device)
        graphs = torch.compile(policy, fullgraph=True, mode="reduce-overhead")
        default = torch.compile(policy, fullgraph=True)

        def run(p):
            def call():
                with torch.no_grad():
                    return p(td.clone())
            return call

        res = _timed({"eager": run(policy), "compiled_default": run(default),
                      "compiled_reduce_overhead": run(graphs)}, device, repeats, INNER["reduce_overhead"], warmup=3)
        out[cell] = res
        print(f"reduce-overhead {cell}: " + ", ".join(
            f"{k} {v['median_s'] * 1e6:.0f} us" for k, v in res.items() if "median_s" in v), flush=True)
    return {"B": B, "F": F, "H": H, "results": out}


def graph_breaks(cells, F, H, device) -> list[dict]:
    """``torch._dynamo.explain`` of the policies built from our modules and from TorchRL's."""
    contenders = [("ours", "auto", False), ("ours", "pad", False), ("ours", "scan", False)]
    contenders += [("torchrl", b, False) for b in ("pad", "auto", "scan")] + [("torchrl", "pad", True)]
    rows = []
    for cell in cells:
        for lib, backend, python_based in contenders:
            for mode in ("step", "batch", "ragged"):
                row = {"cell": cell, "lib": lib, "recurrent_backend": backend, "python_based": python_based,
                       "mode": mode}
                try:
                    policy = _policy(cell, lib, F, H, device, backend, python_based)
                    td = _policy_input(cell, mode, 3, 5, F, H, device)
                    torch._dynamo.reset()
                    with rf.set_recurrent_mode(mode != "step"):
                        report = torch._dynamo.explain(policy)(td)
                    row.update(graph_count=report.graph_count, graph_break_count=report.graph_break_count,
                               reasons=sorted({str(b.reason).splitlines()[0][:160] for b in report.break_reasons}))
                except Exception as exc:  # TorchRL configurations that cannot be traced at all
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                rows.append(row)
                print(f"breaks {cell} {lib} {backend}{' python_based' if python_based else ''} {mode}: "
                      f"{row.get('graph_break_count', row.get('error'))}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="LSTM only, fewer lengths and repeats")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sections", default="compile_time,speed,kernel_floor,reduce_overhead,graph_breaks")
    parser.add_argument("--cells", default=None, help="comma-separated cells (default: lstm,gru; lstm with --quick)")
    parser.add_argument("--floor-contenders", default=",".join(FLOOR_CONTENDERS),
                        help="kernel_floor section: which of our paths to time next to torch.nn")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 on CPU: on a loaded shared machine multi-threaded "
                             "kernels of sub-millisecond calls wait on busy cores and the timings become erratic)")
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    cells = args.cells.split(",") if args.cells else (["lstm"] if args.quick else ["lstm", "gru"])
    sections = set(args.sections.split(","))
    B, F, H = (16, 32, 64) if device.type == "cpu" else (64, 64, 256)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"compile_{device.type}.json"
    result = json.loads(path.read_text()) if path.exists() else {}  # sections not rerun are kept
    result["environment"] = environment(device)
    if "graph_breaks" in sections:
        result["graph_breaks"] = graph_breaks(["lstm", "gru"], 3, 4, device)
    if "compile_time" in sections:
        lengths = [16, 256] if args.quick else [16, 64, 256]
        result["compile_time"] = compile_time(cells, lengths, 4, F, H, device)
    if "speed" in sections:
        result["speed"] = speed(cells, B, 32, F, H, device, repeats=5 if args.quick else 9)
    if "kernel_floor" in sections:
        floor = result.setdefault("kernel_floor", {})  # per cell: a run for one cell keeps the other's
        for cell in cells:
            floor[cell] = kernel_floor(cell, 32, 64, 64, 128, device, repeats=5 if args.quick else 9,
                                       contenders=tuple(args.floor_contenders.split(",")))
            path.write_text(json.dumps(result, indent=1))
    if "reduce_overhead" in sections:
        result["reduce_overhead"] = reduce_overhead(cells, B, F, H, device, repeats=9)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
