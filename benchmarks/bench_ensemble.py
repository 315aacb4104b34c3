"""Training an ensemble of E recurrent models: ``torch.vmap`` over stacked params vs a loop over members.

    python benchmarks/bench_ensemble.py [--cell lstm|gru] [--members 8] [--batch 32] [--time 64]
                                        [--hidden 128] [--threads 1] [--repeats R]
                                        [--malloc default|keep|thp|hugetlb] [--contenders NAME ...]
                                        [--out results/ensemble_sweep_cpu.json]
    python benchmarks/bench_ensemble.py --report [--out ...]   # table + plot + docs from the JSON

One invocation measures one cell (one cell type, one E): forward + backward of ``y.sum()``
(grads w.r.t. every member's params), input shared by the members, 5% random resets, one
layer, F = H. The contenders run side by side in one process (``_timing.interleaved``:
rotating rounds, median; ``settle``: each timed call right after an untimed call of the same
contender, so that it meets the heap its own previous call left, as one training step meets the
last, not the one its neighbour left); compiling takes 10-40 s per compiled contender on a 2-core CPU, so
a sweep runs one cell per invocation, each merged into the JSON as a row keyed by
``(cell, E, B, T, H, threads, malloc)`` (re-running a cell replaces its row)::

    for cell in lstm gru; do for e in 1 4 8 16; do
      python benchmarks/bench_ensemble.py --threads 1 --cell $cell --members $e
    done; done   # and the variants of REPRODUCE below (--malloc keep, --threads 2)
    python benchmarks/bench_ensemble.py --report   # other shapes (--batch, --hidden) get rows of their own

Contenders (``--contenders``; the first five by default):

- ``eager loop``: one ``backend="auto"`` call per member (with interior resets ``auto`` picks
  ``reference``; see docs/backends.md).
- ``eager vmap``: ``torch.vmap`` over the stacked params, ``backend="auto"`` (``reference``
  under eager vmap).
- ``compiled loop``: one member's forward compiled (``fullgraph=True``, ``auto`` -> ``scan``;
  its backward is compiled with it), called once per member.
- ``compiled vmap``: ``torch.compile(torch.vmap(...), fullgraph=True)`` forward, its backward
  compiled with it.
- ``GEMM floor``: only the matrix products of the E members' fwd+bwd, as bare ``torch.mm`` calls
  (per member: input projection and its weight gradient, T recurrent products forward and T
  backward, the recurrent weight gradient; no input gradient, which no contender computes: ``x``
  does not require grad). No ensemble can beat the compiled loop by more than
  ``compiled loop / GEMM floor`` without doing those products faster. Each row also records the
  floor's rate (GFLOP/s) and that of one large ``[2048, 2048] @ [2048, 2048]`` product at the same
  thread count (``gemm_peak_gflops``): how far the floor's products are from the BLAS's own peak.
- ``eager vmap (scan)``: eager vmap forced to ``scan`` (why ``auto`` does not pick it there).
- ``compiled vmap fwd``: the compiled vmap, forward only, under ``no_grad``.
- ``compiled vmap (reference)``: the compiled vmap forced to ``reference`` (the time loop
  unrolled: minutes to compile at T=64).

``--malloc keep`` makes glibc serve every allocation from its heap and never hand freed memory back
to the OS (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 2**31 - 1)``, before anything is
allocated): by default, the compiled ensemble's buffers, E times a member's (tens of MB), are mapped
fresh on every call and page-faulted in (docs/ensembles.md, "Speed"), while a member's stay reused.

``--malloc thp`` sets ``THP_MEM_ALLOC_ENABLE=1``, PyTorch's own switch (read at its first allocation):
its CPU allocator aligns blocks of 2 MB or more to 2 MB and ``madvise(MADV_HUGEPAGE)``-s them, so
fresh memory faults in 2 MB at a time. ``--malloc hugetlb`` sets ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
(glibc >= 2.35: the same advice for glibc's heap and its large mmaps). Both are environment variables
read once, so the script re-executes itself with the variable set. Each timed contender also records its
minor page faults and system time per call (``getrusage`` over two more calls).

A contender that fails records its error. ``--report`` prints the table of every row, draws
``<out stem>.png`` (speed-up over the compiled loop against E) and rewrites the ensemble
section of ``docs/benchmarks.md`` (between its GENERATED markers) from the JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

# allocator settings read from the environment once, at the process's (or torch's) first allocation:
# ``--malloc thp|hugetlb`` re-executes this script with the variable set, before torch is imported
ENV_MALLOC = {"thp": ("THP_MEM_ALLOC_ENABLE", "1"), "hugetlb": ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")}


def _reexec_with_malloc_env(argv: list[str]) -> None:
    """Re-execute with the environment variable of ``--malloc thp|hugetlb`` set (no-op otherwise)."""
    chosen = next((v for a, v in zip(argv, argv[1:]) if a == "--malloc"), None)
    chosen = next((a.split("=", 1)[1] for a in argv if a.startswith("--malloc=")), chosen)
    if chosen in ENV_MALLOC:
        name, value = ENV_MALLOC[chosen]
        if os.environ.get(name) != value:
            os.execve(sys.executable, [sys.executable, *argv], {**os.environ, name: value})


if __name__ == "__main__":
    _reexec_with_malloc_env(sys.argv)

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # _timing, and this checkout's rnn_functional
from _timing import environment, interleaved  # noqa: E402

import rnn_functional as rf  # noqa: E402

DEFAULT_OUT = HERE / "results" / "ensemble_sweep_cpu.json"
DOC_PAGE = HERE.parent / "docs" / "benchmarks.md"
DOC_ASSETS = HERE.parent / "docs" / "assets" / "benchmarks"
BEGIN = "<!-- BEGIN GENERATED (benchmarks/bench_ensemble.py --report) -->"
END = "<!-- END GENERATED (ensembles) -->"
SWEEP = ["eager loop", "eager vmap", "compiled loop", "compiled vmap", "GEMM floor"]
EXTRA = ["eager vmap (scan)", "compiled vmap fwd", "compiled vmap (reference)"]
BASELINE = "compiled loop"  # the target: the compiled ensemble against this
REPRODUCE = """for cell in lstm gru; do for e in 1 4 8 16; do   # one process per row, merged into the JSON
  python benchmarks/bench_ensemble.py --threads 1 --cell $cell --members $e
  python benchmarks/bench_ensemble.py --threads 1 --malloc keep --cell $cell --members $e \\
    --contenders "compiled loop" "compiled vmap" "GEMM floor"
done; for m in thp hugetlb; do
  python benchmarks/bench_ensemble.py --threads 1 --malloc $m --cell $cell --members 8 \\
    --contenders "compiled loop" "compiled vmap" "GEMM floor"
done; for m in default keep thp hugetlb; do
  python benchmarks/bench_ensemble.py --threads 2 --malloc $m --cell $cell --members 8 \\
    --contenders "compiled loop" "compiled vmap" "GEMM floor"
done; done
python benchmarks/bench_ensemble.py --report   # this table and plot"""
MAIN_SHAPE = (32, 64, 128)  # (B, T, H): the sweep's shape, the one plotted
KEY = ("cell", "members", "batch", "time", "hidden", "threads", "malloc")
MALLOC = {"default": "glibc defaults", "keep": "glibc heap kept (no mmap, no trim)",
          "thp": "THP_MEM_ALLOC_ENABLE=1 (torch: 2 MB-aligned, madvise(MADV_HUGEPAGE) blocks >= 2 MB)",
          "hugetlb": "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc: transparent huge pages for its heap and mmaps)"}
DEFAULT_VARIANT = (1, "default")  # (threads, malloc) of the rows the plot draws in full
_NOISE = ("While executing", "Original traceback", "Set TORCHDYNAMO", "from user code", "For more information")


class ContenderFailed(Exception):
    """A contender's exception, its message cut to the lines that say what failed."""


def _reporting(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, with an exception re-raised as a one-line summary (compiler errors span pages)."""

    def run() -> None:
        try:
            fn()
        except Exception as exc:
            lines = []
            for line in (s.strip() for s in str(exc).splitlines()):
                if line.startswith(_NOISE):
                    break
                if line:
                    lines.append(line)
            raise ContenderFailed(f"{type(exc).__name__}: {' '.join(lines)[:600]}") from exc

    return run


def build_contenders(cell: str, e: int, b: int, t: int, h: int, names: list[str],
                     device: torch.device = torch.device("cpu")) -> dict[str, Callable[[], None]]:
    """name -> zero-argument fwd+bwd call, for the contenders in ``names`` (see module doc)."""
    init = rf.ensemble_init_lstm_params if cell == "lstm" else rf.ensemble_init_gru_params
    seq = rf.lstm_sequence if cell == "lstm" else rf.gru_sequence
    g = torch.Generator().manual_seed(0)
    stacked = init(e, h, h, generator=g).to(device).requires_grad_(True)
    leaves = list(stacked.values())
    members = rf.unstack_params(stacked)
    x = torch.randn(b, t, h, generator=g).to(device)
    is_init = (torch.rand(b, t, generator=g) < 0.05).to(device)

    def member_out(p, backend: str = "auto") -> torch.Tensor:
        return seq(x, None, p, is_init=is_init, backend=backend)[0]

    def ensemble_out(params, backend: str = "auto") -> torch.Tensor:
        return torch.vmap(lambda p: member_out(p, backend))(params)

    def backward(y: torch.Tensor) -> None:
        torch.autograd.grad(y.sum(), leaves)

    def loop(step: Callable) -> Callable[[], None]:
        return lambda: torch.autograd.grad(sum(step(p).sum() for p in members), leaves)

    def compiled(fn: Callable) -> Callable:
        return torch.compile(fn, fullgraph=True)

    def gemm_floor() -> Callable[[], None]:
        gates, n = stacked["weight_hh_l0"].shape[1], b * t
        inp, h_t = torch.randn(n, h, device=device), torch.randn(b, h, device=device)
        d_gates, d_gates_t = torch.randn(n, gates, device=device), torch.randn(b, gates, device=device)
        w_ih, w_hh = torch.randn(gates, h, device=device), torch.randn(gates, h, device=device)

        def member() -> None:
            torch.mm(inp, w_ih.t()), torch.mm(d_gates.t(), inp)  # projection, d_W_ih (x needs no gradient)
            for _ in range(t):
                torch.mm(h_t, w_hh.t()), torch.mm(d_gates_t, w_hh)  # recurrent product, its backward
            torch.mm(d_gates.t(), inp)  # d_W_hh (K = B*T, as d_W_ih)

        return lambda: [member() for _ in range(e)]

    def forward_only(fn: Callable) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                fn(stacked)

        return run

    factories: dict[str, Callable[[], Callable[[], None]]] = {
        "eager loop": lambda: loop(member_out),
        "eager vmap": lambda: lambda: backward(ensemble_out(stacked)),
        "eager vmap (scan)": lambda: lambda: backward(ensemble_out(stacked, "scan")),
        "compiled loop": lambda: loop(compiled(member_out)),
        "compiled vmap": lambda: (lambda f: lambda: backward(f(stacked)))(compiled(ensemble_out)),
        "compiled vmap fwd": lambda: forward_only(compiled(ensemble_out)),
        "GEMM floor": gemm_floor,
        "compiled vmap (reference)": lambda: (lambda f: lambda: backward(f(stacked)))(
            compiled(lambda p: ensemble_out(p, "reference"))
        ),
    }
    return {name: _reporting(factories[name]()) for name in names}


def row_key(config: dict) -> tuple:
    return tuple(config.get(k, "default") for k in KEY)  # rows measured before --malloc: glibc defaults


def keep_heap() -> None:
    """glibc: every allocation from the heap, freed memory never returned to the OS (see module doc)."""
    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        raise RuntimeError("--malloc keep: mallopt failed (glibc only)")


def kernel_load(fn: Callable[[], None], calls: int = 2) -> dict:
    """Per call of ``fn`` (already warm): minor page faults and the process's system (kernel) time,
    from ``getrusage`` over ``calls`` calls; the page faults of freshly mapped memory show here."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"minor_faults_per_call": (after.ru_minflt - before.ru_minflt) / calls,
            "system_s_per_call": (after.ru_stime - before.ru_stime) / calls}


def floor_flops(cell: str, e: int, b: int, t: int, h: int) -> float:
    """Floating-point operations of the ``GEMM floor`` contender (F = H): per member, four
    ``[B*T, H] x [H, G*H]``-sized products (projection, its weight gradient, T recurrent products
    forward and T backward) and the recurrent weight gradient, ``2 * B*T * H * G*H`` each."""
    gates = (4 if cell == "lstm" else 3) * h
    return e * 5 * 2 * b * t * h * gates


def gemm_peak_gflops(n: int = 2048, calls: int = 5) -> float:
    """GFLOP/s of the fastest of ``calls`` ``[n, n] @ [n, n]`` products at the current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def merge_row(path: Path, row: dict) -> dict:
    """Add ``row`` to the sweep JSON at ``path`` (replacing the row with the same key); returns the document."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    rows = [r for r in doc.get("rows", []) if row_key(r["config"]) != row_key(row["config"])]
    rows.append(row)
    rows.sort(key=lambda r: row_key(r["config"]))
    doc = {"benchmark": "ensemble of recurrent models, fwd+bwd: vmap vs loop over members, eager vs compiled",
           "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def measure(args: argparse.Namespace) -> dict:
    """Time one cell; returns its JSON row."""
    torch.set_num_threads(args.threads)
    if args.malloc == "keep":
        keep_heap()
    device = torch.device(args.device)
    names = args.contenders or SWEEP
    contenders = build_contenders(args.cell, args.members, args.batch, args.time, args.hidden, names, device)
    results = interleaved(contenders, device, warmup=2, repeats=args.repeats, max_seconds=60.0, settle=True)
    for name, fn in contenders.items():
        if "median_s" in results[name]:
            results[name].update(kernel_load(fn))
    if "median_s" in results.get("GEMM floor", {}):
        flops = floor_flops(args.cell, args.members, args.batch, args.time, args.hidden)
        results["GEMM floor"]["gflops"] = flops / results["GEMM floor"]["median_s"] / 1e9
    config = {"cell": args.cell, "members": args.members, "batch": args.batch, "time": args.time,
              "hidden": args.hidden, "threads": args.threads, "malloc": args.malloc, "input": args.hidden, "layers": 1,
              "reset_prob": 0.05, "dtype": "float32", **({} if device.type == "cpu" else {"device": device.type})}
    row = {"config": config, "environment": environment(device), "results": results,
           **({"gemm_peak_gflops": gemm_peak_gflops()} if device.type == "cpu" else {})}
    for base in ("eager loop", BASELINE):
        ref = results.get(base, {}).get("median_s")
        if ref:
            row[f"speedup_vs_{base.replace(' ', '_')}"] = {
                n: ref / r["median_s"] for n, r in results.items() if "median_s" in r
            }
    return row


def _shape(row: dict) -> tuple[int, int, int]:
    c = row["config"]
    return c["batch"], c["time"], c["hidden"]


def _variant(row: dict) -> tuple[int, str]:
    return row["config"]["threads"], row["config"].get("malloc", "default")


def _display_order(row: dict) -> tuple:
    return (row["config"]["cell"], _shape(row) != MAIN_SHAPE, _shape(row), _variant(row) != DEFAULT_VARIANT,
            _variant(row), row["config"]["members"])


def _cell_ms(res: dict, base: dict | None) -> str:
    if "error" in res:
        return "error"
    text = f"{1e3 * res['median_s']:.0f}"
    if base and "median_s" in base:
        text += f" ({base['median_s'] / res['median_s']:.2f}x)"
    return text


def table(doc: dict) -> str:
    """Markdown: one line per (cell, B x T x H, E), one column per contender: median ms (speed-up over
    the compiled loop)."""
    rows = sorted(doc["rows"], key=_display_order)
    names = [n for n in SWEEP + EXTRA if any(n in r["results"] for r in rows)]
    faults = any("minor_faults_per_call" in v for r in rows for v in r["results"].values())
    rates = any("gflops" in r["results"].get("GEMM floor", {}) for r in rows)
    lines = ["| cell | B x T x H | threads | malloc | E | " + " | ".join(names)
             + (" | page faults per call: compiled vmap / loop" if faults else "")
             + (" | GFLOP/s: floor / one large GEMM" if rates else "") + " |",
             "|---|---|---:|---|---:|" + "---:|" * (len(names) + faults + rates)]
    for r in rows:
        res, c = r["results"], r["config"]
        cells = [_cell_ms(res[n], res.get(BASELINE)) if n in res else "" for n in names]
        if faults:
            cells.append(" / ".join(f"{res[n]['minor_faults_per_call']:.0f}" if "minor_faults_per_call" in res.get(n, {})
                                    else "-" for n in ("compiled vmap", BASELINE)))
        if rates:
            floor = res.get("GEMM floor", {})
            cells.append(f"{floor['gflops']:.0f} / {r['gemm_peak_gflops']:.0f}" if "gflops" in floor and "gemm_peak_gflops" in r
                         else "")
        shape = f"{c['batch']} x {c['time']} x {c['hidden']}"
        threads, malloc = _variant(r)
        head = f"| {c['cell'].upper()} | {shape} | {threads} | {malloc} | {c['members']} | "
        lines.append(head + " | ".join(cells) + " |")
    compile_lines = []
    for r in (r for r in rows if _variant(r) == DEFAULT_VARIANT):
        first = {n: v["first_call_s"] for n, v in r["results"].items()
                 if n.startswith("compiled") and "first_call_s" in v}
        if first:
            c = r["config"]
            compile_lines.append(f"{c['cell'].upper()} E={c['members']}: " + ", ".join(
                f"{n} {s:.0f} s" for n, s in first.items()))
    errors = [f"{r['config']['cell'].upper()} E={r['config']['members']}, `{n}`: {v['error']}"
              for r in rows for n, v in r["results"].items() if "error" in v]
    out = "\n".join(lines)
    if compile_lines:
        out += "\n\nFirst call (compilation included): " + "; ".join(compile_lines) + "."
    if errors:
        out += "\n\nErrors:\n\n" + "\n".join(f"* {e}" for e in errors)
    return out


def plot(doc: dict, png: Path) -> None:
    """Speed-up over the compiled loop against E at ``MAIN_SHAPE``, one panel per cell type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({r["config"]["cell"] for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells) + 3, 3.6), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        at_shape = [r for r in doc["rows"] if r["config"]["cell"] == cell and _shape(r) == MAIN_SHAPE]
        variants = sorted({_variant(r) for r in at_shape}, key=lambda v: (v != DEFAULT_VARIANT, v))
        for variant in variants:  # every contender for the default variant, the compiled vmap for the others
            rows = sorted((r for r in at_shape if _variant(r) == variant), key=lambda r: r["config"]["members"])
            for name in SWEEP + EXTRA if variant == DEFAULT_VARIANT else ["compiled vmap"]:
                pts = [(r["config"]["members"], r["results"][BASELINE]["median_s"] / r["results"][name]["median_s"])
                       for r in rows if "median_s" in r["results"].get(name, {})
                       and "median_s" in r["results"].get(BASELINE, {})]
                label = name if variant == DEFAULT_VARIANT else f"{name}, {variant[0]} thread(s), malloc {variant[1]}"
                if pts:  # tab20: one colour per line (the default cycle repeats after 10); other variants as diamonds
                    full = variant == DEFAULT_VARIANT
                    ax.plot(*zip(*pts), marker="o" if full else "D", linestyle="-" if full else "--", label=label,
                            color=plt.cm.tab20(len(ax.get_lines()) % 20))
        ax.axhline(1.5, color="grey", linestyle=":", linewidth=1, label="target 1.5x")
        ax.set_xscale("log", base=2)
        es = sorted({r["config"]["members"] for r in at_shape})
        ax.set_xticks(es, [str(e) for e in es])
        ax.set_xlabel("members E")
        ax.set_ylabel("speed-up over compiled loop (same variant)")
        ax.set_title(f"{cell.upper()} fwd+bwd, B x T x H = " + " x ".join(map(str, MAIN_SHAPE)))
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def section(doc: dict, png_name: str) -> str:
    """The ensemble section of ``docs/benchmarks.md`` (markers included) for the sweep JSON ``doc``."""
    env = doc["rows"][0]["environment"]
    loads = [r["environment"]["load_average_1m"] for r in doc["rows"]
             if r["environment"].get("load_average_1m") is not None]
    load = f"; 1-min load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return (
        f"{BEGIN}\n\n### Ensembles: training E members (`bench_ensemble.py`)\n\n"
        "Batch B, time T, hidden H per row (F = H), L=1, 5% random resets, forward+backward, shared input; "
        f"{env['device_name']}, torch threads and allocator setting per row (`--malloc`: "
        + "; ".join(f"`{k}`: {v}" for k, v in MALLOC.items()) + "), one process per row, contenders "
        f"interleaved, each timed call right after an untimed call of the same contender{load}; torch "
        f"{env['torch']}. ms per call: median over rounds (speed-up over the compiled loop of the same row; "
        f"`GEMM floor`: the members' matrix products alone as bare `mm` calls, see docs/ensembles.md).\n\n{table(doc)}\n\n```bash\n{REPRODUCE}\n```\n\n"
        f"![{png_name}](assets/benchmarks/{png_name})\n\n{END}"
    )


def report(path: Path) -> None:
    """Print the table, draw the plot (next to the JSON and in the docs assets), rewrite the docs section."""
    doc = json.loads(path.read_text())
    print(table(doc))
    png = path.with_suffix(".png")
    plot(doc, png)
    DOC_ASSETS.mkdir(parents=True, exist_ok=True)
    shutil.copy(png, DOC_ASSETS / png.name)
    page = DOC_PAGE.read_text()
    if BEGIN in page:
        head, rest = page.split(BEGIN, 1)
        page = head + section(doc, png.name) + rest.split(END, 1)[1]
    else:
        page = page.rstrip("\n") + "\n\n" + section(doc, png.name) + "\n"
    DOC_PAGE.write_text(page)
    print(f"wrote {png}, {DOC_ASSETS / png.name}, {DOC_PAGE}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--time", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 is steadier on a shared CPU)")
    ap.add_argument("--malloc", choices=sorted(MALLOC), default="default",
                    help="; ".join(f"{k}: {v}" for k, v in MALLOC.items()))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--contenders", nargs="+", choices=SWEEP + EXTRA, help=f"default: {', '.join(SWEEP)}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="sweep JSON the row is merged into")
    ap.add_argument("--report", action="store_true", help="no timing: table, plot and docs from --out")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA auto runs triton, one launch for the ensemble)")
    args = ap.parse_args()
    if args.report:
        report(args.out)
        return
    row = measure(args)
    doc = merge_row(args.out, row)
    print(table({"rows": [row]}))
    print(f"merged into {args.out} ({len(doc['rows'])} rows)")


if __name__ == "__main__":
    main()
