"""How cheap can an eager policy step get here? The work every validated step does, timed beside ours.

Issue 26 asks ``lstm_step`` / ``gru_step`` for <= 1.3x a bare ``nn.LSTMCell`` / ``nn.GRUCell`` (B=32, F=64, H=128,
no grad, ``is_init`` True for ~10% of rows), with the call validated once. Timed side by side in one process, under
``torch.no_grad``, 1 and 2 threads, every contender on the same weights and inputs (each sample ``inner`` calls):

* ``nn cell``: ``nn.LSTMCell`` / ``nn.GRUCell`` on ``[B, H]`` states, no reset (the baseline);
* ``kernel``: ATen's fused cell alone (``torch.lstm_cell`` / ``torch.gru_cell``);
* ``resets + kernel``: the two ``torch.where`` resets of ``[B, 1, H]`` states, then the kernel: no check at all;
* ``inline checks``: every check ``lstm_step`` makes (param keys, shapes, dtype and device; ``x``; the state; ``is_init``;
  autocast; grad mode; the backend), written out in one function, then the resets and a direct kernel call: the
  leanest step the one validation allows;
* ``ours``: ``lstm_step`` / ``gru_step`` as shipped.

``inline checks / nn cell`` is the floor of the issue's step ratio on this machine at this moment. Writes
``results/step_floor_cpu.json``; ``--report`` writes its table in ``docs/benchmarks.md``.

    python benchmarks/bench_step_floor.py && python benchmarks/bench_step_floor.py --report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment, interleaved, repeated_no_grad, section_main  # noqa: E402

import rnn_functional as rf  # noqa: E402
from rnn_functional.functional import _core, selection  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "step_floor_cpu.json"
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN GENERATED: bench_step_floor -->", "<!-- END GENERATED: bench_step_floor -->"
B, F, H = 32, 64, 128
CELLS = {"lstm": (rf.init_lstm_params, rf.lstm_step, torch.nn.LSTMCell, torch.lstm_cell),
         "gru": (rf.init_gru_params, rf.gru_step, torch.nn.GRUCell, torch.gru_cell)}
NAMES = ("nn cell", "kernel", "resets + kernel", "inline checks", "ours")
WEIGHTS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")  # one layer's, in the kernels' order


def contenders(cell: str) -> dict:
    init, step, nn_cell, kernel = CELLS[cell]
    g = torch.Generator().manual_seed(0)
    params = init(F, H, generator=g)
    lstm = cell == "lstm"
    x, is_init = torch.randn(B, F, generator=g), torch.rand(B, generator=g) < 0.1
    parts = tuple(torch.randn(B, 1, H, generator=g) for _ in range(2 if lstm else 1))
    state = parts if lstm else parts[0]
    weights = tuple(params[k] for k in WEIGHTS)
    bare = nn_cell(F, H)
    flat = tuple(p[:, 0].clone() for p in parts)
    c = _core.CELLS[cell]

    def run_kernel(x, carry, w):
        new = kernel(x, tuple(s.squeeze(1) for s in carry) if lstm else carry[0].squeeze(1), *w)
        new = new if lstm else (new,)
        return new[0], tuple(s.unsqueeze(1) for s in new)

    def reset_and_run(x, carry, mask, w):
        m = mask.view(-1, 1, 1)
        return run_kernel(x, tuple([torch.where(m, 0.0, s) for s in carry]), w)

    def inline(x, state, params, is_init):
        p = _core._as_tensor_map(params, c)
        layout = c.read_layout(p)
        if not isinstance(x, torch.Tensor) or x.ndim < 1 or x.shape[-1] != layout.input_size:
            raise ValueError("x")
        dtype, device, cast = layout.dtype, layout.device, _core.autocast_dtype(layout)
        if (x.dtype != dtype and x.dtype != cast) or x.device != device:
            raise ValueError("x")
        lead = tuple(x.shape[:-1])
        carry = _core._as_carry(c, state, "state")
        for t, size in zip(carry, layout.state_sizes):
            if t.shape != (*lead, layout.num_layers, size) or (t.dtype != dtype and t.dtype != cast) \
                    or t.device != device:
                raise ValueError("state")
        mask = _core._check_mask(is_init, lead)
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            raise ValueError("timed under no_grad")
        selection.resolve_step("auto", layout, x)
        x = c.prepare_input(p, x)
        return reset_and_run(x, carry, mask, tuple(p[k] for k in WEIGHTS))

    with torch.no_grad():
        y, new = step(x, state, params, is_init=is_init)
        torch.testing.assert_close(inline(x, state, params, is_init), (y, new if lstm else (new,)), rtol=0, atol=0)
    return {"nn cell": lambda: bare(x, flat if lstm else flat[0]),
            "kernel": lambda: kernel(x, flat if lstm else flat[0], *weights),
            "resets + kernel": lambda: reset_and_run(x, parts, is_init, weights),
            "inline checks": lambda: inline(x, state, params, is_init),
            "ours": lambda: step(x, state, params, is_init=is_init)}


def run(threads: list[int], repeats: int, inner: int) -> dict:
    rows = []
    for cell in CELLS:
        calls = {name: repeated_no_grad(fn, inner) for name, fn in contenders(cell).items()}
        for n in threads:
            torch.set_num_threads(n)
            timed = interleaved(calls, torch.device("cpu"), repeats=repeats, warmup=2, max_seconds=60)
            us = {name: round(timed[name]["median_s"] / inner * 1e6, 1) for name in NAMES}
            rows.append(dict(cell=cell, threads=n, us=us,
                             ratio={name: round(us[name] / us["nn cell"], 3) for name in NAMES[1:]}))
            print(json.dumps(rows[-1]), flush=True)
    return {"environment": environment(torch.device("cpu")), "settings": {"inner": inner, "repeats": repeats},
            "rows": rows}


def section(doc: dict) -> str:
    lines = ["| cell | threads | nn cell (us) | " + " | ".join(f"{n} (us, / nn cell)" for n in NAMES[1:]) + " |",
             "|---|---|---|" + "---|" * (len(NAMES) - 1)]
    for r in doc["rows"]:
        us, ratio = r["us"], r["ratio"]
        lines.append(f"| {r['cell']} | {r['threads']} | {us['nn cell']} | "
                     + " | ".join(f"{us[n]} ({ratio[n]:.2f}x)" for n in NAMES[1:]) + " |")
    env = doc["environment"]
    return (f"{BEGIN}\n\n" + "\n".join(lines) + f"\n\nMeasured on {env.get('device_name', 'CPU')} "
            f"({env.get('cpu_count')} cores), torch {env.get('torch')}, {env.get('date', '')}: B={B}, F={F}, "
            f"H={H}, no grad, `is_init` ~10% True; median of interleaved rounds of {doc['settings']['inner']} calls. "
            f"Regenerate with `python benchmarks/bench_step_floor.py && python benchmarks/bench_step_floor.py "
            f"--report`.\n\n{END}")


def main() -> None:
    section_main(__doc__.splitlines()[0], RESULTS, PAGE, BEGIN, END,
                 lambda quick, threads: run(threads, 3 if quick else 31, 5 if quick else 300), section)


if __name__ == "__main__":
    main()
