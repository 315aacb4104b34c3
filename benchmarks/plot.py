"""Plots and the docs table from the benchmark JSON files.

    python benchmarks/plot.py [results/suite_quick_cpu.json ...]

Reads ``results/suite_*.json`` (from ``run.py``) and ``results/cpu_backends.json`` (from
``bench_cpu_backends.py``), or the files given, and writes next to each JSON:

* ``<stem>_time.png``: median time per call of every contender (rows: cell, columns: fwd,
  fwd+bwd), one group of bars per configuration, log scale;
* ``<stem>_speedup.png``: TorchRL's best backend time divided by ours (functional ``auto`` and our
  module), from the medians and from the minima;
* ``<stem>_policy.png``: step latency of a whole policy;
* ``<stem>_memory.png``: peak memory of forward+backward;
* ``cpu_backends.png``.

The PNGs are copied to ``docs/assets/benchmarks/`` and the tables between the GENERATED markers of
``docs/benchmarks.md`` are rewritten from the JSON (nothing in them is typed by hand).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"
DOC_PAGE = DOCS / "benchmarks.md"
DOC_ASSETS = DOCS / "assets" / "benchmarks"
BEGIN, END = "<!-- BEGIN GENERATED (benchmarks/plot.py) -->", "<!-- END GENERATED -->"


def _median(res: dict) -> float | None:
    return res.get("median_s")


def _config(row: dict) -> str:
    return f"B={row['B']} T={row['T']} p={row['reset_prob']:g}"


def _names(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(n for r in rows for n in r["results"]))


def best(results: dict, prefix: str, stat: str = "median_s") -> tuple[str, float] | None:
    """The fastest contender whose name starts with ``prefix`` (``(name, seconds)``)."""
    timed = [(n, r[stat]) for n, r in results.items() if n.startswith(prefix) and stat in r]
    return min(timed, key=lambda t: t[1]) if timed else None


def speedups(row: dict, stat: str = "median_s") -> dict[str, float]:
    """TorchRL's best time over ours (``auto``, our module, our best), for one sequence row.

    ``stat``: ``"median_s"`` or ``"min_s"`` (the latter is steadier on a loaded machine).
    """
    res = row["results"]
    theirs = best(res, "torchrl/", stat)
    out = {}
    if theirs is None:
        return out
    for key, name in (("vs_auto", "ours/auto"), ("vs_module", "ours/module (auto)")):
        if stat in res.get(name, {}):
            out[key] = theirs[1] / res[name][stat]
    mine = best(res, "ours/", stat)
    if mine is not None:
        out["vs_best"] = theirs[1] / mine[1]
    return out


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# ---------------------------------------------------------------------------- plots


def _bars(ax, groups: list[str], series: dict[str, list[float | None]], ylabel: str, log: bool) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def _has_memory(doc: dict) -> bool:
    return any(v.get("peak_bytes") for r in doc["sequence"] if r["mode"] == "fwd+bwd" for v in r["results"].values())


def asset_names(path: Path, doc: dict) -> list[str]:
    """The PNG names ``plot_suite``/``plot_cpu_backends`` write for the results file ``path``."""
    if "sequence" not in doc:
        return [path.stem + ".png"]
    kinds = ["time", "speedup"] + (["policy"] if doc.get("policy_step") else []) + (["memory"] if _has_memory(doc) else [])
    return [f"{path.stem}_{k}.png" for k in kinds]


def plot_suite(doc: dict, stem: Path) -> list[Path]:
    """The suite figures (see :func:`asset_names`); returns their paths."""
    rows = doc["sequence"]
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    modes = ["fwd", "fwd+bwd"]
    title = f"{doc['env']['device_name']} ({doc['env']['device']}), grid {doc['grid']['name']}"
    paths = []

    fig, axes = plt.subplots(len(cells), 2, figsize=(14, 4.5 * len(cells)), squeeze=False)
    for i, cell in enumerate(cells):
        for j, mode in enumerate(modes):
            sel = [r for r in rows if r["cell"] == cell and r["mode"] == mode]
            series = {n: [(_median(r["results"].get(n, {})) or 0) * 1e3 or None for r in sel] for n in _names(sel)}
            _bars(axes[i][j], [_config(r) for r in sel], series, "ms per call (median)", log=True)
            axes[i][j].set_title(f"{cell.upper()} {mode}")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "_time.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(cells), figsize=(7 * len(cells), 4), squeeze=False)
    for i, cell in enumerate(cells):
        sel = [r for r in rows if r["cell"] == cell]
        series = {}
        for stat, label in (("median_s", "median"), ("min_s", "min")):
            sp = [speedups(r, stat) for r in sel]
            series[f"TorchRL best / ours auto ({label})"] = [x.get("vs_auto") for x in sp]
            if any("vs_module" in x for x in sp):
                series[f"TorchRL best / ours module ({label})"] = [x.get("vs_module") for x in sp]
        _bars(axes[0][i], [f"{_config(r)} {r['mode']}" for r in sel], series, "speedup (x)", log=False)
        axes[0][i].axhline(1.0, color="black", lw=0.8)
        axes[0][i].set_title(cell.upper())
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "_speedup.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    prow = doc.get("policy_step", [])
    if prow:
        fig, ax = plt.subplots(figsize=(9, 4))
        groups = [f"{r['cell'].upper()} B={r['B']}" for r in prow]
        series = {n: [(_median(r["results"].get(n, {})) or 0) * 1e6 or None for r in prow] for n in _names(prow)}
        _bars(ax, groups, series, "us per policy call (median)", log=False)
        ax.legend(fontsize=7)
        ax.set_title(f"Step-mode policy latency: {title}", fontsize=9)
        fig.tight_layout()
        paths.append(stem.with_name(stem.name + "_policy.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    mem = [r for r in rows if r["mode"] == "fwd+bwd"]
    if _has_memory(doc):
        fig, ax = plt.subplots(figsize=(12, 4))
        series = {n: [(r["results"].get(n, {}).get("peak_bytes") or 0) / 2**20 or None for r in mem]
                  for n in _names(mem)}
        _bars(ax, [f"{r['cell'].upper()} {_config(r)}" for r in mem], series, "peak MiB (fwd+bwd)", log=True)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(f"Peak memory of forward+backward: {title}", fontsize=9)
        fig.tight_layout()
        paths.append(stem.with_name(stem.name + "_memory.png"))
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def plot_cpu_backends(doc: dict, stem: Path) -> Path:
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(10, 4))
    groups = [_cpu_col(r, doc) for r in rows]
    series = {n: [(_median(r["results"].get(n, {})) or 0) * 1e3 or None for r in rows] for n in _names(rows)}
    _bars(ax, groups, series, "ms per call (median)", log=True)
    ax.legend(fontsize=7)
    s = doc["shape"]
    ax.set_title(f"CPU backends, B={s['B']} T={s['T']} F={s['F']} H={s['H']}, {_resets(doc)} "
                 f"({doc['env']['device_name']}, {doc['env']['torch_threads']} threads)", fontsize=9)
    fig.tight_layout()
    path = stem.with_suffix(".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- tables


def _ms(res: dict) -> str:
    return f"{res['median_s'] * 1e3:.2f} ({res['min_s'] * 1e3:.2f})" if "median_s" in res else "error"


def _env_line(doc: dict) -> str:
    e = doc["env"]
    return (f"{e['device_name']} ({e['device']}, {e['torch_threads']} torch threads, 1-min load average "
            f"{e.get('load_average_1m', float('nan')):.1f}); torch {e['torch']}, tensordict {e['tensordict']}, "
            f"torchrl {e['torchrl']}; {e['date']}")


def suite_tables(doc: dict, name: str, assets: list[str]) -> str:
    rows = doc["sequence"]
    g = doc["grid"]
    out = [f"### Suite `{name}`", "", f"Measured on {_env_line(doc)}. Grid `{g['name']}`: F={g['F']}, "
           f"H={g['H']}, L={g['L']}; {doc.get('total_s', 0) / 60:.1f} min in all.", ""]
    for stat, label in (("median_s", "medians"), ("min_s", "minima")):
        sp = [speedups(r, stat) for r in rows]
        ratio = {k: [x[k] for x in sp if k in x] for k in ("vs_auto", "vs_module", "vs_best")}
        if not ratio["vs_auto"]:
            continue
        parts = [f"{geomean(ratio['vs_auto']):.2f}x the time of our `auto` (functional call; range "
                 f"{min(ratio['vs_auto']):.2f}x to {max(ratio['vs_auto']):.2f}x)"]
        if ratio["vs_module"]:
            parts.append(f"{geomean(ratio['vs_module']):.2f}x the time of our `LSTMModule`/`GRUModule` with "
                         f"`recurrent_backend=\"auto\"` (the same TensorDict call; range "
                         f"{min(ratio['vs_module']):.2f}x to {max(ratio['vs_module']):.2f}x)")
        parts.append(f"{geomean(ratio['vs_best']):.2f}x the time of our fastest backend")
        out += [f"**Headline, from the {label}** (geometric mean over the {len(ratio['vs_auto'])} sequence rows "
                "below): TorchRL's fastest backend for each row takes " + "; ".join(parts) + ".", ""]
    for cell in dict.fromkeys(r["cell"] for r in rows):
        for mode in ("fwd", "fwd+bwd"):
            sel = [r for r in rows if r["cell"] == cell and r["mode"] == mode]
            names = _names(sel)
            out += [f"**{cell.upper()} {mode}**, ms per call: median (min) over rounds; ratios from the medians:", "",
                    "| config | " + " | ".join(names) + " | TorchRL best / ours auto | TorchRL best / ours module |",
                    "|---|" + "---:|" * (len(names) + 2)]
            for r in sel:
                x = speedups(r)
                out.append(f"| {_config(r)} | " + " | ".join(_ms(r["results"].get(n, {})) for n in names) + " | "
                           + " | ".join(f"{x[k]:.2f}x" if k in x else "n/a" for k in ("vs_auto", "vs_module")) + " |")
            out.append("")
    mem = [r for r in rows if r["mode"] == "fwd+bwd"]
    if _has_memory(doc):
        names = _names(mem)
        out += ["**Peak memory of forward+backward**, MiB:", "",
                "| cell, config | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for r in mem:
            cells = []
            for n in names:
                b = r["results"].get(n, {}).get("peak_bytes")
                cells.append(f"{b / 2**20:.1f}" if b is not None else "n/a")
            out.append(f"| {r['cell'].upper()} {_config(r)} | " + " | ".join(cells) + " |")
        out.append("")
    prow = doc.get("policy_step", [])
    if prow:
        names = _names(prow)
        out += ["**Step-mode policy latency** (one call of RNN module + MLP head, no grad), us: median (min):", "",
                "| cell, B | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for r in prow:
            out.append(f"| {r['cell'].upper()} B={r['B']} | " + " | ".join(
                f"{r['results'][n]['median_s'] * 1e6:.0f} ({r['results'][n]['min_s'] * 1e6:.0f})"
                if "median_s" in r["results"].get(n, {}) else "n/a"
                for n in names) + " |")
        out.append("")
    out += [f"![{p}](assets/benchmarks/{p})" for p in assets] + [""]
    return "\n".join(out)


def _cpu_col(row: dict, doc: dict) -> str:
    swept = isinstance(doc["shape"]["reset_prob"], list)
    return f"{row['cell'].upper()} {row['mode']}" + (f" p={row['reset_prob']:g}" if swept else "")


def _resets(doc: dict) -> str:
    p = doc["shape"]["reset_prob"]
    return f"{p:.0%} random resets" if not isinstance(p, list) else "reset probability " + ", ".join(f"{x:g}" for x in p)


def _cpu_cell(row: dict, name: str) -> str:
    res, pad = row["results"].get(name, {}), row["results"].get("ours/pad", {})
    if "median_s" not in res:
        return "n/a"
    ratio = f", {res['median_s'] / pad['median_s']:.2f}x pad" if "median_s" in pad else ""
    return f"{res['median_s'] * 1e3:.1f} ({res['min_s'] * 1e3:.1f}{ratio})"


def cpu_backend_markdown(doc: dict) -> str:
    """The CPU backend table: ms per call, median (min) over rounds, and the median's ratio to ``pad``.

    One column per (cell, mode); a reset-probability sweep is transposed (one row per config).
    """
    rows, names = doc["rows"], _names(doc["rows"])
    if isinstance(doc["shape"]["reset_prob"], list):
        out = ["| config | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        out += [f"| {_cpu_col(r, doc)} | " + " | ".join(_cpu_cell(r, n) for n in names) + " |" for r in rows]
    else:
        out = ["| backend | " + " | ".join(_cpu_col(r, doc) for r in rows) + " |", "|---|" + "---:|" * len(rows)]
        out += [f"| {n} | " + " | ".join(_cpu_cell(r, n) for r in rows) + " |" for n in names]
    return "\n".join(out)


def cpu_backend_table(doc: dict, asset: str) -> str:
    s = doc["shape"]
    title = "### CPU backends (the `auto` choice)" + (", reset probability sweep" if isinstance(s["reset_prob"], list) else "")
    return "\n".join([
        title, "",
        f"B={s['B']}, T={s['T']}, F={s['F']}, H={s['H']}, L={s['L']}, {_resets(doc)}; "
        f"measured on {_env_line(doc)}. ms per call: median over rounds (min, and the median's ratio to "
        "`ours/pad`).", "", cpu_backend_markdown(doc), "", f"![{asset}](assets/benchmarks/{asset})", ""])


def result_files() -> list[Path]:
    """The committed results, in page order: suites first, then the CPU backend table."""
    return sorted(RESULTS.glob("suite_*.json")) + sorted(RESULTS.glob("cpu_backends*.json"))


def generated_block(docs: list[tuple[Path, dict]]) -> str:
    """The text between the GENERATED markers of ``docs/benchmarks.md`` for these results."""
    sections = []
    for path, doc in docs:
        names = asset_names(path, doc)
        sections.append(suite_tables(doc, path.stem, names) if "sequence" in doc else cpu_backend_table(doc, names[0]))
    return "\n\n" + "\n".join(sections) + "\n"


def write_doc(block: str) -> None:
    """Replace the GENERATED block of ``docs/benchmarks.md`` with ``block``."""
    text = DOC_PAGE.read_text() if DOC_PAGE.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC_PAGE}: the markers {BEGIN!r} and {END!r} are missing; add them where the "
                         "generated tables should go.")
    head, rest = text.split(BEGIN, 1)
    DOC_PAGE.write_text(head + BEGIN + block + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="default: results/suite_*.json and results/cpu_backends*.json")
    ap.add_argument("--no-doc", action="store_true", help="only the plots; leave docs/benchmarks.md alone")
    args = ap.parse_args(argv)
    files = args.files or result_files()
    DOC_ASSETS.mkdir(parents=True, exist_ok=True)
    docs = []
    for f in files:
        doc = json.loads(f.read_text())
        paths = plot_suite(doc, f.with_suffix("")) if "sequence" in doc else [plot_cpu_backends(doc, f.with_suffix(""))]
        assert [p.name for p in paths] == asset_names(f, doc)
        for p in paths:
            shutil.copy(p, DOC_ASSETS / p.name)
            print(f"wrote {p}")
        docs.append((f, doc))
    if not args.no_doc:
        write_doc(generated_block(docs))
        print(f"wrote {DOC_PAGE}")


if __name__ == "__main__":
    main()
