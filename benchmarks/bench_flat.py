"""Flat ragged SliceSampler batches and [B, T] batches with resets: our modules against TorchRL's.

    python benchmarks/bench_flat.py [--threads N] [--repeats R] [--quick]
    python benchmarks/bench_flat.py --table | --summary    (the docs' tables, from the results)
    python benchmarks/bench_flat.py --plot                 (results/flat_cpu.png and its docs copy)
    python benchmarks/bench_flat.py --confirm --repeats 21 [--only 'N=200 slices =64|resets 5%']
    python benchmarks/bench_flat.py --confirm-table        (auto against our paths, round by round)

Recurrent mode, eager, CPU, H=128, F=64, one layer; every case is timed in one process with
the contenders interleaved (``_timing.interleaved``, a random order per round: in a rotated order
``auto`` always ran after the same contender and paid up to 1.3x for it) on the same weights and
TensorDicts:

* flat ``[N]`` batches of concatenated slices, ``is_init`` True at every slice start, N in
  {200, 1024, 4096}, slice lengths {8, 20, 64}, either full slices (the last one cut to fit N)
  or truncated ones (lengths drawn uniformly in ``[1, slice_len]``, as ``strict_length=False``
  gives near episode ends); plus batches sampled by a real ``SliceSampler`` over a real
  ``TensorDictReplayBuffer`` of episodes of random lengths;
* ``[B, T] = [32, 64]`` with ``is_init`` True at t=0 and with probability {0, 1%, 5%, 20%} elsewhere.

Modes: ``fwd`` (forward under ``torch.no_grad``) and ``fwd+bwd`` (forward, ``y.sum().backward()``).

Contenders: our ``LSTMModule``/``GRUModule`` with ``recurrent_backend="auto"``, and with each exact
eager path forced (``reference``: the loop over T; ``pad``: whole slices as a view of the call, else
segments in length buckets, one unpacked ATen call each; ``packed``: segments packed into one ATen call; ``segments``: the reference loop over
the right-aligned segments; ``scan`` / ``scan_segments``: the ``scan`` backend's eager loop over T
or over the segments); TorchRL's module with every backend it runs on CPU (``pad``, ``scan``,
``python_based=True``); and ``aten floor``: the bare unpacked ``nn.LSTM``/``nn.GRU`` calls on the
length buckets our ``pad`` path runs (no resets, no gathers, no TensorDict): the kernel time any
re-batching path pays. Writes ``results/flat_cpu.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rnn_functional, not an installed one
from _timing import Budget, environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
F_IN, HIDDEN = 64, 128
BT = (32, 64)


def flat_lengths(n: int, slice_len: int, truncated: bool, g: torch.Generator) -> list[int]:
    """Slice lengths summing to ``n``: full slices (last one cut), or uniform in ``[1, slice_len]``."""
    lengths: list[int] = []
    while sum(lengths) < n:
        step = int(torch.randint(1, slice_len + 1, (), generator=g)) if truncated else slice_len
        lengths.append(min(step, n - sum(lengths)))
    return lengths


def sampled_is_init(n: int, slice_len: int, seed: int) -> torch.Tensor:
    """``is_init [n]`` of a batch drawn by ``SliceSampler`` from a replay buffer of episodes.

    The buffer holds 40 episodes of 10 to 300 steps (``is_init`` True at each episode's first
    step, as ``InitTracker`` writes it). A slice that starts inside an episode starts a new
    chunk too: its first step is marked where the sampled indices jump.
    """
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    g = torch.Generator().manual_seed(seed)
    eps = torch.randint(10, 301, (40,), generator=g).tolist()
    total = sum(eps)
    traj = torch.repeat_interleave(torch.arange(len(eps)), torch.tensor(eps))
    is_init = torch.zeros(total, dtype=torch.bool)
    is_init[torch.tensor([0] + eps[:-1]).cumsum(0)] = True
    done = torch.zeros(total, 1, dtype=torch.bool)
    done[torch.tensor(eps).cumsum(0) - 1] = True
    data = TensorDict({"is_init": is_init, "step": torch.arange(total), ("collector", "traj_ids"): traj,
                       ("next", "done"): done}, [total])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(total),
                                sampler=SliceSampler(slice_len=slice_len, strict_length=False), batch_size=n)
    rb.extend(data)
    torch.manual_seed(seed)
    sample = rb.sample()
    step = sample["step"]
    starts = sample["is_init"].clone()
    starts[0] = True
    starts[1:] |= step[1:] != step[:-1] + 1
    return starts


def make_case(spec: dict, g: torch.Generator):
    """``(batch_shape, is_init [*batch, 1])`` of one case."""
    kind = spec["kind"]
    if kind == "bt":
        b, t = BT
        is_init = torch.rand(b, t, 1, generator=g) < spec["reset_prob"]
        is_init[:, 0] = True
        return (b, t), is_init
    if kind == "sampler":  # strict_length=False may return fewer than n steps (short slices dropped)
        is_init = sampled_is_init(spec["n"], spec["slice_len"], seed=spec["n"])
        return (is_init.shape[0],), is_init.unsqueeze(-1)
    lengths = flat_lengths(spec["n"], spec["slice_len"], spec["truncated"], g)
    is_init = torch.zeros(spec["n"], 1, dtype=torch.bool)
    is_init[torch.tensor([0] + lengths[:-1]).cumsum(0)] = True
    return (spec["n"],), is_init


def cases(quick: bool) -> list[dict]:
    ns = (200, 1024) if quick else (200, 1024, 4096)
    out = [{"kind": "flat", "n": n, "slice_len": s, "truncated": tr} for n in ns for s in (8, 20, 64) for tr in (False, True)]
    out += [{"kind": "sampler", "n": n, "slice_len": s} for n, s in ((200, 20), (1024, 64))]
    out += [{"kind": "bt", "reset_prob": p} for p in (0.0, 0.01, 0.05, 0.2)]
    return out


def case_name(spec: dict) -> str:
    if spec["kind"] == "bt":
        return f"[32, 64] resets {spec['reset_prob']:.0%}"
    if spec["kind"] == "sampler":
        return f"SliceSampler N={spec['n']} slice_len={spec['slice_len']}"
    return f"flat N={spec['n']} slices {'<=' if spec['truncated'] else '='}{spec['slice_len']}"


# our exact eager paths, forced through the public functions (backend, segment_layout)
PATHS = {"pad": ("pad", "auto"), "packed": ("pad", "packed"), "segments": ("reference", "aligned"),
         "scan_segments": ("scan", "aligned"), "reference": ("reference", "rows"), "scan": ("scan", "rows"),
         "triton": ("triton", "auto")}  # its one layout, without the host read a forced layout makes


def path_name(route) -> str:
    """The name of :data:`PATHS` (or ``pad``'s own layouts) of a route ``rf.sequence_route`` returns."""
    if route.backend == "triton":
        return "triton"
    if route.backend == "pad":
        return "packed" if route.segments == "packed" else "pad"
    return {"rows": route.backend, "aligned": "segments" if route.backend == "reference" else "scan_segments"}[route.segments]


def contenders(trm, cell: str, batch: tuple, is_init: torch.Tensor, mode: str, ours_only: bool = False,
               device: torch.device = torch.device("cpu")) -> dict:
    """name -> one timed call of each contender; ``ours_only``: ``auto`` and our forced exact paths. On CUDA our
    ``triton`` path and TorchRL's ``triton`` backend join (``pad`` is cuDNN there)."""
    lstm = cell == "lstm"
    keys = (dict(in_keys=["x", "h", "c"], out_keys=["y", ("next", "h"), ("next", "c")]) if lstm
            else dict(in_keys=["x", "h"], out_keys=["y", ("next", "h")]))
    ours_cls, theirs_cls = (rf.LSTMModule, trm.LSTMModule) if lstm else (rf.GRUModule, trm.GRUModule)
    child = "lstm" if lstm else "gru"
    torch.manual_seed(0)
    base = theirs_cls(F_IN, HIDDEN, device=device, **keys)
    x = torch.randn(*batch, F_IN).to(device)
    zeros = torch.zeros(*batch, 1, HIDDEN, device=device)
    is_init = is_init.to(device)
    entries = {"x": x, "h": zeros, "is_init": is_init}
    if lstm:
        entries["c"] = zeros.clone()
    data = TensorDict(entries, list(batch), device=device)

    ours = ours_cls(**{child: getattr(base, child)}, recurrent_backend="auto", **keys)
    modules = {"ours auto": (ours, None)}
    # Long flat rows (N > 200): the T-step loops over one row and TorchRL's scan (10-100x slower at
    # N=200) would take minutes per case; they are measured at N=200 and on [B, T] only.
    long_flat = len(batch) == 1 and batch[0] > 200
    cuda = device.type == "cuda"
    for path in ("pad", "packed", "segments", "scan_segments") + (() if long_flat else ("reference", "scan")) + (
            ("triton",) if cuda else ()):
        modules[f"ours {path}"] = (ours, path)
    kernel, blocks = None, []
    if not ours_only:
        # TorchRL's eager scan, its slowest backend here, is left out on CUDA: a lease's flat step did not finish
        # its first case in 58-71 s with it (docs/gpu.md); TorchRL's fused backends (cuDNN, triton) stand there
        for backend in ("pad",) + (() if long_flat or cuda else ("scan",)) + (("triton",) if cuda else ()):
            modules[f"torchrl {backend}"] = (theirs_cls(**{child: getattr(base, child)}, recurrent_backend=backend, **keys), None)
        py = theirs_cls(F_IN, HIDDEN, python_based=True, device=device, **keys)
        getattr(py, child).load_state_dict(getattr(base, child).state_dict())
        modules["torchrl python_based"] = (py, None)

        # the floor: the bare unpacked ATen calls (no resets, nothing around them) on the length buckets
        # of the case's segments, as our ``pad`` path runs them (one [S, Lmax] block for full slices)
        kernel = (torch.nn.LSTM if lstm else torch.nn.GRU)(F_IN, HIDDEN, batch_first=True, device=device)
        blocks = [torch.randn(end - first, steps, F_IN, device=device)
                  for first, end, steps in bucket_shapes(cell, is_init.cpu(), mode != "fwd")]
        modules["aten floor"] = (kernel, None)

    with torch.no_grad(), trm.set_recurrent_mode(True):  # same outputs before timing
        want = base(data.clone(False))["y"]
        # cuDNN multiplies fp32 in TF32 by default (torch.backends.cudnn.allow_tf32): 3e-5 apart on an H200
        tol = dict(atol=1e-3, rtol=1e-3) if device.type == "cuda" else dict(atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours(data.clone(False))["y"], want, **tol)

    sequence = rf.lstm_sequence if lstm else rf.gru_sequence
    params = rf.params_from_module(getattr(ours, child))
    mask = is_init.squeeze(-1)

    def call(module, path):
        def forced():  # the module's work through the function, with the path forced
            backend, layout = PATHS[path]
            y, *_ = sequence(x, None, params, is_init=mask, backend=backend, segment_layout=layout,
                             return_segment_states=True)
            return y

        def run():
            if path:
                if mode == "fwd":
                    with torch.no_grad():
                        forced()
                    return
                ours.zero_grad(set_to_none=True)
                forced().sum().backward()
                return
            if module is kernel:
                kernel.zero_grad(set_to_none=True)
                with torch.no_grad() if mode == "fwd" else _null():
                    ys = [kernel(block)[0] for block in blocks]
                if mode != "fwd":
                    sum(y.sum() for y in ys).backward()
                return
            if mode == "fwd":
                with torch.no_grad(), trm.set_recurrent_mode(True):
                    module(data.clone(False))
                return
            module.zero_grad(set_to_none=True)
            with trm.set_recurrent_mode(True):
                out = module(data.clone(False))
            out["y"].sum().backward()
        return run

    return {name: call(m, path) for name, (m, path) in modules.items()}


@contextmanager
def _null():
    yield


def _plan(cell: str, is_init: torch.Tensor, mode: str = "fwd+bwd", layout: str = "auto", device: str = "cpu"):
    mask = is_init.squeeze(-1).to(device)
    mask = mask.unsqueeze(0) if mask.ndim == 1 else mask
    params = (rf.init_lstm_params if cell == "lstm" else rf.init_gru_params)(F_IN, HIDDEN, device=device)
    x = torch.zeros(*mask.shape, F_IN, device=device)
    return rf.sequence_route(cell, x, params, is_init=mask, backend="pad" if layout != "auto" else "auto",
                             records_grad=mode != "fwd", segment_layout=layout)


def segment_stats(is_init: torch.Tensor) -> dict:
    """Rows, steps, segments and longest segment of a case, as the core sees it."""
    from rnn_functional.backends import segments

    mask = is_init.squeeze(-1)
    mask = mask.unsqueeze(0) if mask.ndim == 1 else mask
    p = segments.plan(mask.numpy(), mask.device)
    return {"rows": p.shape[0], "steps": p.shape[1], "segments": p.count, "longest": p.max_len}


def bucket_shapes(cell: str, is_init: torch.Tensor, records_grad: bool = True) -> list[tuple[int, int, int]]:
    """``(first, end, steps)`` of the length buckets our ``pad`` path cuts the case's segments into."""
    from rnn_functional.backends import segments
    from rnn_functional.functional._core import read_layout

    mask = is_init.squeeze(-1)
    mask = mask.unsqueeze(0) if mask.ndim == 1 else mask
    params = (rf.init_lstm_params if cell == "lstm" else rf.init_gru_params)(F_IN, HIDDEN)
    plan = segments.plan(mask.numpy(), mask.device)
    return [(first, end, steps) for first, end, steps, _ in segments.buckets(plan, read_layout(params, cell),
                                                                               records_grad)]


def auto_path(cell: str, is_init: torch.Tensor, mode: str, device: str = "cpu") -> str:
    """The exact eager path ``auto`` picks for this case on ``device`` (a name of :data:`PATHS`)."""
    return path_name(_plan(cell, is_init, mode, device=device))


def _quartiles(ratios: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, q2, q3


def confirm_row(res: dict, pick: str) -> dict:
    """Round-by-round ratios of one confirmation case: ``auto`` and the forced column of its pick
    against our best exact path (the one with the lowest median), and ``auto`` against its pick (the
    cost of deciding). Each ratio is taken within a round (calls back to back, same load) and
    summarised by its quartiles. ``verdict``: ``miss`` where even the lower quartile of pick / best
    exceeds 1.10, ``noise`` where only the median does, else ``ok``."""
    rounds = {n: r["rounds_s"] for n, r in res.items() if "rounds_s" in r}
    n_rounds = min(len(s) for s in rounds.values())
    forced = {n: statistics.median(s) for n, s in rounds.items() if n != "ours auto"}
    best = min(forced, key=forced.get)

    def ratio(a: str, b: str) -> list[float]:
        return [rounds[a][i] / rounds[b][i] for i in range(n_rounds)]

    row = {"best": best[5:], "pick": pick, "rounds": n_rounds, "ms": {n: 1e3 * t for n, t in forced.items()},
           "ms_auto": 1e3 * statistics.median(rounds["ours auto"]),
           "auto_vs_best": _quartiles(ratio("ours auto", best)),
           "pick_vs_best": _quartiles(ratio(f"ours {pick}", best)),
           "auto_vs_pick": _quartiles(ratio("ours auto", f"ours {pick}"))}
    q1, q2, _ = row["pick_vs_best"]
    row["verdict"] = "miss" if q1 > 1.10 else "noise" if q2 > 1.10 else "ok"
    return row


def confirm_table(rows: list[dict]) -> str:
    """Markdown table of the confirmation rows: medians (ms) and ratio quartiles ``q2 [q1-q3]``."""
    def q(v):
        return f"{v[1]:.2f} [{v[0]:.2f}-{v[2]:.2f}]"

    out = ["| case | cell | mode | S | Lmax | auto picks | pick ms | best (ms) | pick / best | auto / best "
           "| auto / pick | verdict |", "|---" * 12 + "|"]
    for r in rows:
        pick_ms, best_ms = r["ms"][f"ours {r['pick']}"], r["ms"][f"ours {r['best']}"]
        out.append(f"| {r['case']} | {r['cell']} | {r['mode']} | {r['segments']} | {r['longest']} | {r['pick']} "
                   f"| {pick_ms:.1f} | {r['best']} ({best_ms:.1f}) "
                   f"| {q(r['pick_vs_best'])} | {q(r['auto_vs_best'])} | {q(r['auto_vs_pick'])} | {r['verdict']} |")
    return "\n".join(out)


def write(out: Path, device: torch.device, rows: list[dict]) -> None:
    """The report so far (rewritten after every case: a long run that stops keeps its rows), in grid order."""
    order = {name: i for i, name in enumerate(case_name(c) for c in cases(False))}
    rows = sorted(rows, key=lambda r: (order.get(r["case"], len(order)), r["cell"] != "lstm", r["mode"] != "fwd+bwd"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": environment(device), "F": F_IN, "H": HIDDEN, "rows": rows}, indent=2))


def markdown(rows: list[dict]) -> str:
    """The docs table: per case, the fastest call (ms) of our paths and TorchRL's, and auto's speedup over
    TorchRL's best, from the fastest calls and from the medians."""
    cols = ("ours auto", "ours pad", "ours packed", "ours segments", "ours scan_segments", "ours reference",
            "ours scan", "torchrl pad", "torchrl scan", "torchrl python_based", "aten floor")
    head = ("| case | cell | mode | S | Lmax | " + " | ".join(c.replace("torchrl", "TorchRL") for c in cols)
            + " | auto picks | auto vs TorchRL best (min) | (median) | auto / our best (min) |\n"
            + "|---" * (len(cols) + 9) + "|")
    lines = [head]
    for r in rows:
        ms = r.get("ms_min", r["ms"])
        cells = " | ".join(f"{ms[c]:.1f}" if c in ms else "-" for c in cols)
        lines.append(f"| {r['case']} | {r['cell']} | {r['mode']} | {r['segments']} | {r['longest']} | {cells} "
                     f"| {r.get('auto_path', '?')} | {r.get('speedup_auto_vs_torchrl_best_min', float('nan')):.2f}x "
                     f"| {r['speedup_auto_vs_torchrl_best']:.2f}x | {r.get('auto_vs_ours_best_min', float('nan')):.2f} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """The compact tables of ``docs/benchmarks.md``, one per mode: per case, TorchRL's backends, ``auto``, our
    fastest exact path and the kernel floor (fastest calls, ms), and the ratios (fastest calls [medians]):
    ``auto`` against TorchRL's best and our best, and the forced column of the path ``auto`` picks against
    our best (the rule's own error, without the noise between two timings of one path)."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        out += [f"**{mode}**", "", "| case | cell | TorchRL pad | TorchRL python_based | ours auto | ours best (path) "
                "| auto picks | auto vs TorchRL best | auto / ours best | pick / ours best | floor |", "|---" * 11 + "|"]
        for r in (r for r in rows if r["mode"] == mode):
            ms, med = r["ms_min"], r["ms"]
            ours = {n: t for n, t in ms.items() if n.startswith("ours ") and n != "ours auto"}
            ours_med = {n: t for n, t in med.items() if n.startswith("ours ") and n != "ours auto"}
            best = min(ours, key=ours.get)
            pick = f"ours {r['auto_path']}"
            floor = f"{ms['aten floor']:.1f}" if "aten floor" in ms else "-"
            out.append(f"| {r['case']} | {r['cell']} | {ms['torchrl pad']:.1f} | {ms['torchrl python_based']:.1f} "
                       f"| {ms['ours auto']:.1f} | {ours[best]:.1f} ({best[5:]}) | {r['auto_path']} "
                       f"| {r['speedup_auto_vs_torchrl_best_min']:.2f}x [{r['speedup_auto_vs_torchrl_best']:.2f}x] "
                       f"| {r['auto_vs_ours_best_min']:.2f} [{r['auto_vs_ours_best']:.2f}] "
                       f"| {ms[pick] / ours[best]:.2f} [{med[pick] / min(ours_med.values()):.2f}] | {floor} |")
        out.append("")
    return "\n".join(out + counts(rows)).rstrip()


def counts(rows: list[dict]) -> list[str]:
    """The issue's two counts per mode, from the fastest calls [and the medians]: ``auto`` (and the forced
    column of its pick) within 10% of our fastest exact path, and ``auto`` >= 1.3x TorchRL's fastest
    backend on the flat rows and the ``[B, T]`` rows with resets."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        picked = [r for r in rows if r["mode"] == mode]
        target = [r for r in picked if r["kind"] != "bt" or r["reset_prob"] > 0]

        def n(pred) -> str:
            return f"{sum(pred(r, 'ms_min') for r in picked)} [{sum(pred(r, 'ms') for r in picked)}]"

        def ours_best(r, key):
            return min(t for c, t in r[key].items() if c.startswith("ours ") and c != "ours auto")

        fast = sum(r["speedup_auto_vs_torchrl_best_min"] >= 1.3 for r in target)
        fast_med = sum(r["speedup_auto_vs_torchrl_best"] >= 1.3 for r in target)
        out.append(f"- {mode}: `auto` within 10% of our best exact path in "
                   f"{n(lambda r, k: r[k]['ours auto'] <= 1.1 * ours_best(r, k))} of {len(picked)} rows, its pick's "
                   f"forced column in {n(lambda r, k: r[k]['ours ' + r['auto_path']] <= 1.1 * ours_best(r, k))}; "
                   f"`auto` >= 1.3x TorchRL's best in {fast} [{fast_med}] of {len(target)} rows with resets.")
    return out


def plot(rows: list[dict], out: Path) -> list[Path]:
    """``out`` (PNG) and its copy in ``docs/assets/benchmarks/``: per mode and cell, every case's speed-up of
    ``auto`` over TorchRL's fastest backend (fastest calls) with the issue's 1.3x line, and our fastest exact
    path's, to show how much of a gap is ``auto``'s choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes, cells = list(dict.fromkeys(r["mode"] for r in rows)), list(dict.fromkeys(r["cell"] for r in rows))
    fig, axes = plt.subplots(len(modes), len(cells), figsize=(9 * len(cells), 5 * len(modes)), squeeze=False)
    for (i, mode), (j, cell) in ((m, c) for m in enumerate(modes) for c in enumerate(cells)):
        ax, picked = axes[i][j], [r for r in rows if r["mode"] == mode and r["cell"] == cell]
        trl = [min(t for n, t in r["ms_min"].items() if n.startswith("torchrl")) for r in picked]
        best = [min(t for n, t in r["ms_min"].items() if n.startswith("ours ") and n != "ours auto") for r in picked]
        xs = range(len(picked))
        ax.bar([x - 0.2 for x in xs], [t / r["ms_min"]["ours auto"] for t, r in zip(trl, picked)], 0.4, label="ours auto")
        ax.bar([x + 0.2 for x in xs], [t / b for t, b in zip(trl, best)], 0.4, label="ours, fastest exact path")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.3, color="red", lw=0.8, ls="--", label="issue 13 target (1.3x)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["case"] for r in picked], rotation=40, ha="right", fontsize=7)
        ax.set_ylabel("speed-up over TorchRL's fastest backend")
        ax.set_title(f"{cell.upper()}, {mode} (CPU, 1 thread, H=128, fastest of the rounds)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out, Path(__file__).resolve().parents[1] / "docs" / "assets" / "benchmarks" / out.name]
    for path in paths:
        fig.savefig(path, dpi=80)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="N in {200, 1024} only")
    ap.add_argument("--cells", default="lstm,gru")
    ap.add_argument("--modes", default="fwd+bwd,fwd")
    ap.add_argument("--only", default="", help="run the cases whose name contains this (alternatives split by '|')")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of --out and exit")
    ap.add_argument("--summary", action="store_true", help="print the compact Markdown table of --out and exit")
    ap.add_argument("--plot", action="store_true", help="plot --out (a PNG beside it and in docs/assets) and exit")
    ap.add_argument("--append", action="store_true", help="keep the rows of --out of other cases")
    ap.add_argument("--confirm", action="store_true",
                    help="auto against each of our exact paths only, ratios per round (--repeats >= 15); "
                         "writes --out (default results/flat_confirm_cpu.json)")
    ap.add_argument("--confirm-table", action="store_true", help="print the confirmation table of --out and exit")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA, triton paths join)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no case after this many seconds (the JSON, rewritten after each, says what ran)")
    args = ap.parse_args(argv)
    args.out = args.out or RESULTS / ("flat_confirm_cpu.json" if args.confirm or args.confirm_table else "flat_cpu.json")
    if args.confirm_table:
        print(confirm_table(json.loads(args.out.read_text())["rows"]))
        return args.out
    if args.plot:
        print("wrote", *plot(json.loads(args.out.read_text())["rows"], args.out.with_suffix(".png")))
        return args.out
    if args.table or args.summary:
        print((markdown if args.table else summary)(json.loads(args.out.read_text())["rows"]))
        return args.out
    if args.threads:
        torch.set_num_threads(args.threads)
    import torchrl.modules as trm

    device = torch.device(args.device)
    budget = Budget(args.budget_s)
    rows = json.loads(args.out.read_text())["rows"] if args.append and args.out.exists() else []
    for spec in (c for c in cases(args.quick) if any(o in case_name(c) for o in args.only.split("|"))):
        if not budget.left():
            break
        batch, is_init = make_case(spec, torch.Generator().manual_seed(7))
        stats = segment_stats(is_init)
        for cell in args.cells.split(","):
            for mode in args.modes.split(","):
                if args.confirm:
                    res = interleaved(contenders(trm, cell, batch, is_init, mode, ours_only=True), device, warmup=3,
                                      repeats=args.repeats, max_seconds=60.0, keep_rounds=True, shuffle=True)
                    row = {"case": case_name(spec), **spec, **stats, "cell": cell, "mode": mode,
                           **confirm_row(res, auto_path(cell, is_init, mode))}
                    rows = [r for r in rows if (r["case"], r["cell"], r["mode"]) != (row["case"], cell, mode)] + [row]
                    write(args.out, device, rows)
                    print(confirm_table([row]).splitlines()[-1], flush=True)
                    continue
                res = interleaved(contenders(trm, cell, batch, is_init, mode, device=device), device, repeats=args.repeats,
                                  max_seconds=4.0, shuffle=True)
                ms = {n: r["median_s"] * 1e3 for n, r in res.items() if "median_s" in r}
                ms_min = {n: r["min_s"] * 1e3 for n, r in res.items() if "min_s" in r}
                trl = {n: t for n, t in ms.items() if n.startswith("torchrl")}
                exact = {n: t for n, t in ms.items() if n.startswith("ours ") and n != "ours auto"}
                trl_min = {n: t for n, t in ms_min.items() if n.startswith("torchrl")}
                exact_min = {n: t for n, t in ms_min.items() if n.startswith("ours ") and n != "ours auto"}
                row = {"case": case_name(spec), **spec, **stats, "cell": cell, "mode": mode,
                       "auto_path": auto_path(cell, is_init, mode, args.device), "ms": ms, "ms_min": ms_min,
                       "errors": {n: r["error"] for n, r in res.items() if "error" in r},
                       "torchrl_best": min(trl, key=trl.get), "ours_best": min(exact, key=exact.get),
                       "speedup_auto_vs_torchrl_best": min(trl.values()) / ms["ours auto"],
                       "auto_vs_ours_best": ms["ours auto"] / min(exact.values()),
                       "speedup_auto_vs_torchrl_best_min": min(trl_min.values()) / ms_min["ours auto"],
                       "auto_vs_ours_best_min": ms_min["ours auto"] / min(exact_min.values())}
                rows = [r for r in rows if (r["case"], r["cell"], r["mode"]) != (row["case"], cell, mode)] + [row]
                write(args.out, device, rows)
                print(f"| {row['case']} | {cell} | {mode} | {stats['segments']} | {stats['longest']} | "
                      + " | ".join(f"{n.split(' ', 1)[1]} {t:.2f}" for n, t in ms.items())
                      + f" | x{row['speedup_auto_vs_torchrl_best']:.2f} | auto/best {row['auto_vs_ours_best']:.2f} |",
                      flush=True)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
