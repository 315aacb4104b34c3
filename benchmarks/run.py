"""Benchmark suite: our backends vs TorchRL's LSTMModule/GRUModule vs torch.nn, side by side.

    python benchmarks/run.py [--quick] [--grid quick|cpu|torchrl] [--device cpu|cuda]

Everything runs in one process, contenders interleaved (see ``_timing.py``):

* sequence (recurrent mode), forward (``torch.no_grad``) and forward+backward of ``y.sum()``:
  our functional ``lstm_sequence``/``gru_sequence`` with every backend (``reference``, ``scan``
  compiled with ``fullgraph=True``, ``pad``, ``triton`` on CUDA, ``auto`` eager), our
  ``LSTMModule``/``GRUModule`` (``recurrent_backend="auto"``) on a ``[B, T]`` TensorDict,
  TorchRL's modules with ``recurrent_backend`` ``pad``/``scan``/``triton`` (CUDA) and
  ``python_based=True``, and ``torch.nn.LSTM``/``GRU`` run *without* resets (the kernel floor);
* step mode: the latency of one call of a whole policy ``TensorDictSequential(rnn module, MLP
  head)`` on a ``[B]`` TensorDict (ours eager and compiled, TorchRL's), and of the same math as
  bare ``nn.LSTMCell``/``GRUCell`` + MLP (no TensorDict, the floor);
* peak memory of every forward+backward contender (see ``_timing.peak_memory``).

All contenders share the same weights and inputs; ``is_init[:, 0]`` is True and every later step
resets with probability ``reset_prob``. The results go to ``benchmarks/results/suite_<grid>_<device>.json``;
``benchmarks/plot.py`` turns them into plots and the table of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Budget, environment, interleaved, peak_memory, write_json  # noqa: E402

import rnn_functional as rf  # noqa: E402
from rnn_functional import available_backends, gru_sequence, lstm_sequence, params_from_module  # noqa: E402

try:
    from rnn_functional import GRUModule, LSTMModule

    OURS_MODULES = {"lstm": LSTMModule, "gru": GRUModule}
except ImportError:  # the modules are optional for the functional benchmarks
    OURS_MODULES = {}

try:
    from torchrl.modules import GRUModule as TorchRLGRUModule
    from torchrl.modules import LSTMModule as TorchRLLSTMModule

    TORCHRL_MODULES = {"lstm": TorchRLLSTMModule, "gru": TorchRLGRUModule}
except ImportError:
    TORCHRL_MODULES = {}

RESULTS = Path(__file__).resolve().parent / "results"
SEQUENCE_FN = {"lstm": lstm_sequence, "gru": gru_sequence}
TORCH_RNN = {"lstm": nn.LSTM, "gru": nn.GRU}
TORCH_CELL = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}
HIDDEN_KEYS = {"lstm": ("recurrent_state_h", "recurrent_state_c"), "gru": ("recurrent_state",)}


@dataclass
class Grid:
    """The configurations one run sweeps: every combination of B, T and reset_prob."""

    name: str
    cells: tuple[str, ...]
    B: tuple[int, ...]
    T: tuple[int, ...]
    reset_prob: tuple[float, ...]
    H: int
    F: int
    L: int
    policy_B: tuple[int, ...]
    warmup: int
    repeats: int
    step_repeats: int
    max_seconds: float  # a contender stops being repeated past this much timed time (>= 3 samples)


GRIDS = {
    # CPU, a few minutes on 2 shared cores: one shape, with and without interior resets
    "quick": Grid("quick", ("lstm", "gru"), (32,), (32,), (0.0, 0.05), 128, 64, 1, (32,), 1, 15, 60, 3.0),
    # CPU, small grid
    "cpu": Grid("cpu", ("lstm", "gru"), (32, 128), (16, 64), (0.0, 0.01, 0.1), 128, 64, 1, (1, 32), 2, 7, 50, 10.0),
    # TorchRL's own grid (for a GPU)
    "torchrl": Grid(
        "torchrl", ("lstm", "gru"), (128, 512, 2048), (16, 64, 256), (0.0, 0.01, 0.1), 256, 256, 1,
        (1, 128, 2048), 3, 15, 100, 20.0,
    ),
}


def make_is_init(B: int, T: int, p: float, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """``[B, T]`` bool: True at t=0 (every row starts a trajectory), then with probability ``p``."""
    is_init = torch.rand(B, T, generator=gen) < p
    is_init[:, 0] = True
    return is_init.to(device)


def _load(module: nn.Module, ref: nn.Module) -> nn.Module:
    """Copy ``ref``'s weights into the RNN held by a TensorDict module (``.lstm``/``.gru``)."""
    rnn = module.lstm if hasattr(module, "lstm") else module.gru
    rnn.load_state_dict(ref.state_dict())
    return module


def _torchrl_module(cell: str, F: int, H: int, L: int, device, ref: nn.Module, **kw) -> nn.Module:
    cls = TORCHRL_MODULES[cell]
    m = cls(input_size=F, hidden_size=H, num_layers=L, in_key="x", out_key="y", device=device, **kw)
    return _load(m, ref)


def _ours_module(cell: str, F: int, H: int, L: int, device, ref: nn.Module, **kw) -> nn.Module:
    cls = OURS_MODULES[cell]
    m = cls(input_size=F, hidden_size=H, num_layers=L, in_key="x", out_key="y", device=device, **kw)
    return _load(m, ref)


def sequence_contenders(cell: str, B: int, T: int, F: int, H: int, L: int, p: float,
                        device: torch.device, grad: bool, seed: int = 0, *, eager_scan: bool = False,
                        torchrl: bool = True, modules: bool = True) -> tuple[dict, dict]:
    """Zero-argument callables, one full call each, and a numerical cross-check.

    ``eager_scan`` adds our ``scan`` backend run eagerly; ``torchrl``/``modules`` include
    TorchRL's modules and our TensorDict modules.

    Returns ``(contenders, check)``; ``check`` holds the max abs difference of our ``auto``
    output against TorchRL's ``pad`` and ``torch.nn`` (the latter only without interior resets).
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = TORCH_RNN[cell](F, H, num_layers=L, batch_first=True, device=device)
    params = params_from_module(ref)
    x = torch.randn(B, T, F, generator=gen).to(device).requires_grad_(grad)
    is_init = make_is_init(B, T, p, device, gen)
    seq = SEQUENCE_FN[cell]

    def run(fn):
        if grad:
            return lambda: fn().sum().backward()

        def no_grad():
            with torch.no_grad():
                return fn()

        return no_grad

    def ours(backend):
        return lambda: seq(x, None, params, is_init=is_init, backend=backend)[0]

    c: dict[str, object] = {}
    c["ours/reference"] = run(ours("reference"))
    compiled = torch.compile(lambda x, is_init: seq(x, None, params, is_init=is_init, backend="scan")[0],
                             fullgraph=True, dynamic=False)
    c["ours/scan (compiled)"] = run(lambda: compiled(x, is_init))
    if eager_scan:
        c["ours/scan (eager)"] = run(ours("scan"))
    c["ours/pad"] = run(ours("pad"))
    if device.type == "cuda" and "triton" in available_backends(device):
        c["ours/triton"] = run(ours("triton"))
    c["ours/auto"] = run(ours("auto"))

    td = TensorDict({"x": x, "is_init": is_init.unsqueeze(-1)}, [B, T], device=device)

    def module_call(m):
        return lambda: m(td.copy())["y"]

    if modules and cell in OURS_MODULES:
        m = _ours_module(cell, F, H, L, device, ref, recurrent_backend="auto", default_recurrent_mode=True)
        c["ours/module (auto)"] = run(module_call(m))
    torchrl_pad = None
    if torchrl and cell in TORCHRL_MODULES:
        backends = ["pad", "scan"] + (["triton"] if device.type == "cuda" else [])
        for b in backends:
            m = _torchrl_module(cell, F, H, L, device, ref, recurrent_backend=b, default_recurrent_mode=True)
            torchrl_pad = m if b == "pad" else torchrl_pad
            c[f"torchrl/{b}"] = run(module_call(m))
        m = _torchrl_module(cell, F, H, L, device, ref, python_based=True, default_recurrent_mode=True)
        c["torchrl/python"] = run(module_call(m))
    c["torch.nn (no resets)"] = run(lambda: ref(x)[0])

    check = {}
    with torch.no_grad():
        y = seq(x, None, params, is_init=is_init, backend="auto")[0]
        if torchrl_pad is not None:
            check["max_abs_diff_vs_torchrl_pad"] = (y - module_call(torchrl_pad)()).abs().max().item()
        if not is_init[:, 1:].any():
            check["max_abs_diff_vs_torch_nn"] = (y - ref(x)[0]).abs().max().item()
    return c, check


def policy_contenders(cell: str, B: int, F: int, H: int, L: int, device: torch.device,
                      seed: int = 0) -> dict:
    """One step of a whole policy (RNN module + MLP head) on a ``[B]`` TensorDict, no grad.

    Also the RNN module alone and the bare ``nn.LSTMCell``/``GRUCell`` (with and without the head).
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = TORCH_RNN[cell](F, H, num_layers=L, batch_first=True, device=device)
    head = nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 8)).to(device)
    data = {"x": torch.randn(B, F, generator=gen), "is_init": torch.rand(B, 1, generator=gen) < 0.05}
    for k in HIDDEN_KEYS[cell]:
        data[k] = torch.randn(B, L, H, generator=gen)
    td = TensorDict(data, [B]).to(device)

    def policy(module):
        return TensorDictSequential(module, TensorDictModule(head, in_keys=["y"], out_keys=["logits"]))

    def call(p):
        def step():
            with torch.no_grad():
                return p(td.copy())["logits"]

        return step

    def call_module(m):
        def step():
            with torch.no_grad():
                return m(td.copy())["y"]

        return step

    c: dict[str, object] = {}
    if cell in OURS_MODULES:
        module = _ours_module(cell, F, H, L, device, ref, recurrent_backend="auto")
        c["ours/module policy (eager)"] = call(policy(module))
        c["ours/module policy (compiled)"] = call(torch.compile(policy(module), fullgraph=True, dynamic=False))
    if cell in TORCHRL_MODULES:
        theirs = _torchrl_module(cell, F, H, L, device, ref)
        c["torchrl/module policy (eager)"] = call(policy(theirs))
    if L == 1:  # the floor: the same math as bare torch.nn modules, no TensorDict
        rnn_cell = TORCH_CELL[cell](F, H, device=device)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(rnn_cell, name).copy_(getattr(ref, f"{name}_l0"))
        x, reset = td["x"], td["is_init"]
        hidden = [td[k][:, 0] for k in HIDDEN_KEYS[cell]]

        def bare(with_head: bool):
            def step():
                with torch.no_grad():
                    hs = [h.masked_fill(reset, 0.0) for h in hidden]
                    out = rnn_cell(x, tuple(hs) if cell == "lstm" else hs[0])
                    h = out[0] if cell == "lstm" else out
                    return head(h) if with_head else h

            return step

        c["torch.nn cell + MLP (no TensorDict)"] = bare(True)
    # the RNN module alone (no head), the call issue 3 compares
    if cell in OURS_MODULES:
        c["ours/module step (eager)"] = call_module(module)
    if cell in TORCHRL_MODULES:
        c["torchrl/module step (eager)"] = call_module(theirs)
    if L == 1:
        c["torch.nn cell (no TensorDict)"] = bare(False)
    # the step function on each step backend (auto's step is triton on CUDA, ATen's fused cell on CPU)
    step_fn = {"lstm": rf.lstm_step, "gru": rf.gru_step}[cell]
    params, state = params_from_module(ref), tuple(td[k] for k in HIDDEN_KEYS[cell])
    for backend in ("pad", "triton") if device.type == "cuda" else ("pad",):
        def function_step(backend=backend):
            with torch.no_grad():
                return step_fn(td["x"], state if cell == "lstm" else state[0], params, is_init=td["is_init"],
                               backend=backend)[0]

        c[f"ours/{cell}_step ({backend})"] = function_step
    return c


def _pairs(grid: Grid) -> list[tuple[int, int]]:
    """The grid's ``(B, T)`` shapes, the middle one first: a run its budget cuts short still has a typical shape."""
    pairs = [(b, t) for b in grid.B for t in grid.T]
    middle = (grid.B[len(grid.B) // 2], grid.T[len(grid.T) // 2])
    return [middle] + [pair for pair in pairs if pair != middle]


def run_grid(grid: Grid, device: torch.device, log, save, budget: Budget, keep=lambda name: True) -> dict:
    """Sweep ``grid`` and return the results document (see the module docstring). ``save(doc)`` is called after
    every row; rows start while ``budget`` has time left; ``keep(name)`` picks the contenders. Policy steps first
    (cheap), then the sequence rows, every cell, mode and reset probability of one shape before the next shape."""
    doc = {"sequence": [], "policy_step": []}
    planned = len(grid.cells) * (len(grid.policy_B) + 2 * len(grid.B) * len(grid.T) * len(grid.reset_prob))

    def done() -> None:
        doc["coverage"] = budget.report(len(doc["sequence"]) + len(doc["policy_step"]), planned)
        save(doc)

    for cell in grid.cells:
        for B in grid.policy_B:
            if not budget.left():
                break
            torch._dynamo.reset()
            contenders = {k: f for k, f in policy_contenders(cell, B, grid.F, grid.H, grid.L, device).items() if keep(k)}
            res = interleaved(contenders, device, warmup=5, repeats=grid.step_repeats, max_seconds=grid.max_seconds)
            doc["policy_step"].append({"cell": cell, "B": B, "F": grid.F, "H": grid.H, "L": grid.L, "results": res})
            log(f"{cell} policy step B={B}: " + "  ".join(
                f"{n}={r['median_s'] * 1e6:.0f}us" if "median_s" in r else f"{n}=ERR" for n, r in res.items()))
            done()
    for B, T in _pairs(grid):
        for p in grid.reset_prob:
            for cell in grid.cells:
                for grad in (False, True):
                    if not budget.left():
                        done()
                        return doc
                    torch._dynamo.reset()  # a fresh compile cache per config: no recompile limit hit
                    contenders, check = sequence_contenders(cell, B, T, grid.F, grid.H, grid.L, p, device, grad)
                    contenders = {k: f for k, f in contenders.items() if keep(k)}
                    t0 = time.perf_counter()
                    res = interleaved(contenders, device, warmup=grid.warmup, repeats=grid.repeats,
                                      max_seconds=grid.max_seconds)
                    if grad:
                        for name, fn in contenders.items():
                            if "error" not in res[name]:
                                res[name]["peak_bytes"] = peak_memory(fn, device)
                    mode = "fwd+bwd" if grad else "fwd"
                    doc["sequence"].append({"cell": cell, "B": B, "T": T, "F": grid.F, "H": grid.H, "L": grid.L,
                                            "reset_prob": p, "mode": mode, "check": check, "results": res})
                    log(f"{cell} B={B} T={T} p={p} {mode}: {time.perf_counter() - t0:.1f}s  " + "  ".join(
                        f"{n}={r['median_s'] * 1e3:.2f}ms" if "median_s" in r else f"{n}=ERR"
                        for n, r in res.items()))
                    done()
    done()
    return doc


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small CPU grid (a few minutes)")
    ap.add_argument("--grid", choices=sorted(GRIDS), help="default: quick with --quick, else torchrl on CUDA, cpu on CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cells", default=None, help="comma-separated subset of lstm,gru")
    ap.add_argument("--B", default=None, help="comma-separated batch sizes replacing the grid's")
    ap.add_argument("--T", default=None, help="comma-separated sequence lengths replacing the grid's")
    ap.add_argument("--reset-probs", default=None, help="comma-separated reset probabilities replacing the grid's")
    ap.add_argument("--policy-B", default=None, help="comma-separated policy-step batch sizes replacing the grid's")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: torch's); 1 is steadier on a shared CPU")
    ap.add_argument("--out", type=Path, default=None, help="output JSON (default: results/suite_<grid>_<device>.json)")
    ap.add_argument("--contenders", default=None,
                    help="a regular expression: time only the contenders whose name it finds (e.g. to measure the "
                         "compiled ones apart, whose first calls compile)")
    ap.add_argument("--skip", default=None, help="a regular expression: leave out the contenders whose name it finds")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no row after this many seconds (the JSON, rewritten after every row, says what ran)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.grid or ("quick" if args.quick else ("torchrl" if device.type == "cuda" else "cpu"))
    grid = GRIDS[name]
    if args.cells:
        grid.cells = tuple(args.cells.split(","))
    if args.B:  # e.g. to split the torchrl grid over several runs (write each with its own --out)
        grid.B = tuple(int(b) for b in args.B.split(","))
    if args.T:
        grid.T = tuple(int(t) for t in args.T.split(","))
    if args.reset_probs:
        grid.reset_prob = tuple(float(p) for p in args.reset_probs.split(","))
    if args.policy_B:
        grid.policy_B = tuple(int(b) for b in args.policy_B.split(","))
    out = args.out or RESULTS / f"suite_{name}_{device.type}.json"
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    doc = {"env": environment(device), "grid": asdict(grid), "notes": {
        "time": "median seconds per call over interleaved rounds (benchmarks/_timing.py)",
        "fwd": "forward under torch.no_grad()",
        "fwd+bwd": "forward, then backward of y.sum() into x and the weights",
        "peak_bytes": "peak memory of one fwd+bwd call above its start (benchmarks/_timing.py)",
        "torch.nn (no resets)": "plain nn.LSTM/GRU on the same x ignoring is_init: a floor, not a correct answer",
        "inputs": "F input features; is_init[:, 0] True, later steps reset with probability reset_prob",
    }}

    def save(rows: dict) -> None:
        write_json(out, {**doc, **rows, "total_s": time.perf_counter() - start})

    def keep(name: str) -> bool:
        return ((args.contenders is None or re.search(args.contenders, name) is not None)
                and (args.skip is None or re.search(args.skip, name) is None))

    run_grid(grid, device, log, save, Budget(args.budget_s), keep)
    log(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
