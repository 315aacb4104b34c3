"""One command for every benchmark: ours, TorchRL's modules and ``torch.nn`` side by side in one process.

    python -m benchmarks SUITE [--device cpu|cuda] [--quick] [--threads N] [--budget-s S] [--rows N] [--skip RE]
                         [--out PATH]
    python -m benchmarks table     # the README's headline table, from benchmarks/results/*_cpu.json
    python -m benchmarks plot      # one PNG per results JSON, under docs/assets/benchmarks/

A suite is a module of this package with ``rows(args)``, yielding one results row at a time
(``common.row``), ``OURS`` and ``BASELINES`` (the contenders the headline table compares) and a
docstring. The JSON (``benchmarks/results/SUITE_DEVICE.json``, overwritten by each run) is
rewritten after every row; with ``--budget-s`` no row starts past that many seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from pathlib import Path

import torch

from . import common
from ._timing import Budget, environment, write_json

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parent / "README.md"
ASSETS = HERE.parent / "docs" / "assets" / "benchmarks"
SUITES = ("sequences", "flat", "policy", "compile", "ensemble", "linear", "block_gru", "torchrl")
MODULES = {"torchrl": "torchrl_benchmark"}  # a module named torchrl would shadow TorchRL on this folder's path
HEADLINE = ("sequences", "flat", "policy", "ensemble", "linear", "block_gru")
BEGIN, END = "<!-- BEGIN TABLE (python -m benchmarks table) -->", "<!-- END TABLE -->"


def run_suite(args: argparse.Namespace) -> Path:
    suite = importlib.import_module(f"benchmarks.{MODULES.get(args.suite, args.suite)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    common.SKIP = re.compile(args.skip) if args.skip else None
    out = args.out or RESULTS / f"{args.suite}_{args.device.type}.json"
    doc = {"suite": args.suite, "command": args.command, "about": suite.__doc__.strip(),
           "environment": environment(args.device), "rows": []}
    budget, start = Budget(args.budget_s), time.perf_counter()
    rows, exhausted = suite.rows(args), False
    while budget.left() and len(doc["rows"]) < (args.rows or float("inf")):
        row = next(rows, None)
        if row is None:
            exhausted = True
            break
        doc["rows"].append(row)
        shown = "  ".join(f"{n}={ms:.3g}" for n, ms in row["ms"].items())
        print(f"[{time.perf_counter() - start:6.1f}s] {row['case']}: {shown} ms"
              + (f"  errors: {row['errors']}" if row["errors"] else ""), flush=True)
        doc["complete"] = False
        write_json(out, doc)
    doc["complete"] = exhausted
    write_json(out, doc)
    print(f"wrote {out}")
    return out


def describe(case: dict, skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items() if k not in skip)


def table(results: Path = RESULTS) -> str:
    """Markdown: per training row (fwd+bwd, with resets) and policy-step row of each headline suite's CPU results,
    our time, the fastest baseline's, and their ratio."""
    lines = ["| suite | case | ours (ms) | fastest baseline (ms) | baseline / ours |", "|---|---|---:|---:|---:|"]
    for name in HEADLINE:
        path = results / f"{name}_cpu.json"
        if not path.exists():
            continue
        suite = importlib.import_module(f"benchmarks.{MODULES.get(name, name)}")
        for r in json.loads(path.read_text())["rows"]:
            base = {b: r["ms"][b] for b in suite.BASELINES if b in r["ms"]}
            case = r["case"]
            if suite.OURS not in r["ms"] or not base or case.get("mode") == "fwd" or case.get("reset_prob") == 0:
                continue
            best = min(base, key=base.get)
            ours = r["ms"][suite.OURS]
            lines.append(f"| {name} | {describe(case, ('mode', 'route', 'dtype'))} | {ours:.3g} ({suite.OURS}) | {base[best]:.3g} ({best}) "
                         f"| {base[best] / ours:.2f}x |")
    return "\n".join(lines)


def write_table(readme: Path = README) -> None:
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    readme.write_text(head + BEGIN + "\n" + table() + "\n" + END + rest.split(END, 1)[1])


def plot(results: Path = RESULTS, assets: Path = ASSETS) -> None:
    """Per results JSON, one horizontal bar chart: every row's contenders, ms per call (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assets.mkdir(parents=True, exist_ok=True)
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("suite") not in SUITES or not doc["rows"]:
            continue
        rows = doc["rows"]
        fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.0 + 0.28 * sum(len(r["ms"]) + 1 for r in rows)),
                                 squeeze=False)
        for ax, r in zip(axes[:, 0], rows):
            names = list(r["ms"])
            ax.barh(names, [r["ms"][n] for n in names], color=["C0" if n.startswith("ours") else "C7" for n in names])
            ax.set_xscale("log")
            ax.invert_yaxis()
            ax.set_title(describe(r["case"]), fontsize=8)
            ax.tick_params(labelsize=7)
        axes[-1, 0].set_xlabel(f"ms per call (median), {doc['environment']['device_name']}")
        fig.tight_layout()
        fig.savefig(assets / path.with_suffix(".png").name, dpi=60)
        plt.close(fig)
        print(f"wrote {assets / path.with_suffix('.png').name}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=[*SUITES, "table", "plot"])
    ap.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    ap.add_argument("--quick", action="store_true", help="one or two small cases per suite, few rounds")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the sequences suite's dtype (fp32 runs TF32 where torch allows it)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no row past this many seconds")
    ap.add_argument("--rows", type=int, default=None, help="stop after this many rows (a smoke run: --quick --rows 1)")
    ap.add_argument("--skip", default=None, help="a regular expression: leave out the contenders whose name it finds "
                    "(e.g. 'compiled' for a smoke run without compilation)")
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/SUITE_DEVICE.json")
    ap.add_argument("--rl", type=Path, default=None, help="torchrl suite: a pytorch/rl checkout or git directory")
    args = ap.parse_args(argv)
    args.command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.suite == "table":
        write_table()
        print(table())
    elif args.suite == "plot":
        plot()
    else:
        run_suite(args)


if __name__ == "__main__":
    main()
