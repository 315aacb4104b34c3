"""TorchRL's own benchmark of its recurrent backends, for TorchRL's modules and for ours, side by side.

    python benchmarks/bench_torchrl_reset.py --rl PATH [--shape B,T,F,H] [--out JSON]
    python benchmarks/bench_torchrl_reset.py --report [--out JSON]   # table + docs section from the JSON

``PATH`` is a pytorch/rl checkout, or its git directory without a work tree (what the tool
library's ``fetch github:pytorch/rl`` returns). Its ``benchmarks/test_rnn_reset_backends_benchmark.py``
and ``benchmarks/conftest.py`` are read from there at run time into a temporary folder (never
copied into this repository) and run as they are with pytest-benchmark, in one process, each
test twice (:mod:`torchrl_swap_plugin`): with TorchRL's ``LSTMModule`` / ``GRUModule`` and with
ours. The test: a ``[B, T]`` rollout with 3% intermediate resets in recurrent mode under
``torch.inference_mode()``, backends ``cudnn`` (``recurrent_backend="pad"``) and ``scan`` (and
``triton`` on CUDA), eager and compiled with TorchRL's ``compile_with_warmup`` (a default
``torch.compile``). The shape is passed through the benchmark's own
``TORCHRL_RNN_RESET_BENCHMARK_SHAPES`` variable (default here B=64, T=64, F=32, H=128).

The JSON (``results/torchrl_reset_<device>.json``) holds every variant's outcome and timing
(median and min ms over pytest-benchmark's rounds) and, per cell, the fastest variant of each
library and their ratio; ``--report`` rewrites the generated section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _timing import environment, write_section  # noqa: E402

RESULTS = HERE / "results"
DOC_PAGE = HERE.parent / "docs" / "benchmarks.md"
TEST_FILE = "benchmarks/test_rnn_reset_backends_benchmark.py"
CONFTEST = "benchmarks/conftest.py"
BEGIN = "<!-- BEGIN GENERATED (benchmarks/bench_torchrl_reset.py --report) -->"
END = "<!-- END GENERATED (benchmarks/bench_torchrl_reset.py --report) -->"
LIBRARIES = ("torchrl", "ours")


def read_rl_file(rl: Path, relpath: str) -> tuple[str, str]:
    """``(text, revision)`` of ``relpath`` in the pytorch/rl checkout or git directory ``rl``."""
    git = ["git", f"--git-dir={rl / '.git' if (rl / '.git').exists() else rl}"]
    revision = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if (rl / relpath).is_file():
        return (rl / relpath).read_text(), revision
    shown = subprocess.run([*git, "show", f"HEAD:{relpath}"], capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--rl {rl}: cannot read {relpath} ({shown.stderr.strip()}); pass a pytorch/rl checkout.")
    return shown.stdout, revision


def _outcomes(junit: Path) -> dict[str, str]:
    """Test name -> ``"passed"``, or the first line of its failure or skip message."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        message = "passed" if problem is None else f"{problem.tag}: {(problem.get('message') or '').splitlines()[0][:200]}"
        out[case.get("name")] = message
    return out


def _one(ids: set[str], choices: tuple[str, ...]) -> str:
    (value,) = ids.intersection(choices)
    return value


def run(rl: Path, shape: str, min_rounds: int) -> dict:
    """Run TorchRL's benchmark file for both libraries; the results document."""
    test_text, revision = read_rl_file(rl, TEST_FILE)
    conftest_text, _ = read_rl_file(rl, CONFTEST)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / Path(TEST_FILE).name).write_text(test_text)
        (tmp / "conftest.py").write_text(conftest_text)
        env = dict(os.environ, TORCHRL_RNN_RESET_BENCHMARK_SHAPES=shape,
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", Path(TEST_FILE).name, "-p", "torchrl_swap_plugin", "-p",
               "no:cacheprovider", "-q", "-rfEs", f"--junit-xml={tmp / 'junit.xml'}",
               f"--benchmark-json={tmp / 'bench.json'}", f"--benchmark-min-rounds={min_rounds}"]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
        outcomes = _outcomes(tmp / "junit.xml")
        timings = json.loads((tmp / "bench.json").read_text())["benchmarks"] if (tmp / "bench.json").exists() else []
    by_name = {b["name"]: b for b in timings}
    rows = []
    for name, outcome in sorted(outcomes.items()):
        ids = set(name[name.index("[") + 1:-1].split("-"))  # the shape's parts, backend, compile, seed, cell, library
        bench = by_name.get(name)
        rows.append({
            "test": name, "cell": _one(ids, ("gru", "lstm")), "library": _one(ids, LIBRARIES),
            "backend": _one(ids, ("cudnn", "scan", "triton")), "compiled": "True" in ids, "outcome": outcome,
            "median_ms": None if bench is None else bench["stats"]["median"] * 1e3,
            "min_ms": None if bench is None else bench["stats"]["min"] * 1e3,
            "rounds": None if bench is None else bench["stats"]["rounds"],
        })
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return {"environment": environment(device), "rl_revision": revision, "shape": shape,
            "pytest_exit_code": proc.returncode, "rows": rows, "summary": summary(rows)}


def summary(rows: list[dict]) -> dict:
    """Per cell: each library's fastest variant (by median) and TorchRL's fastest over ours."""
    out = {}
    for cell in sorted({r["cell"] for r in rows}):
        best = {}
        for lib in LIBRARIES:
            timed = [r for r in rows if r["cell"] == cell and r["library"] == lib and r["median_ms"] is not None]
            best[lib] = min(timed, key=lambda r: r["median_ms"], default=None)
        ratio = (best["torchrl"]["median_ms"] / best["ours"]["median_ms"]) if all(best.values()) else None
        out[cell] = {f"{lib}_fastest": None if best[lib] is None else
                     {k: best[lib][k] for k in ("backend", "compiled", "median_ms")} for lib in LIBRARIES}
        out[cell]["speedup"] = ratio
    return out


def _variant(r: dict) -> str:
    return f"{r['backend']}{' compiled' if r['compiled'] else ''}"


def table(doc: dict) -> str:
    """Markdown: one row per cell and variant, both libraries side by side; then the fastest of each."""
    lines = ["| cell | variant | TorchRL ms (median / min) | ours ms (median / min) | TorchRL / ours |", "|---|---|---|---|---|"]
    cells = {(r["cell"], _variant(r)) for r in doc["rows"]}

    def shown(r):
        if r is None:
            return "not run"
        if r["median_ms"] is None:
            return "skipped" if r["outcome"].startswith("skipped") else "failed"
        return f"{r['median_ms']:.1f} / {r['min_ms']:.1f}"

    for cell, variant in sorted(cells):
        pair = {r["library"]: r for r in doc["rows"] if (r["cell"], _variant(r)) == (cell, variant)}
        t, o = pair.get("torchrl"), pair.get("ours")
        ratio = f"{t['median_ms'] / o['median_ms']:.2f}x" if t and o and t["median_ms"] and o["median_ms"] else "-"
        lines.append(f"| {cell.upper()} | {variant} | {shown(t)} | {shown(o)} | {ratio} |")
    lines += ["", "| cell | TorchRL's fastest | ours fastest | speed-up |", "|---|---|---|---|"]
    for cell, s in doc["summary"].items():
        t, o = s["torchrl_fastest"], s["ours_fastest"]
        fmt = lambda b: "-" if b is None else f"{_variant(b)}: {b['median_ms']:.1f} ms"  # noqa: E731
        speedup = "-" if s["speedup"] is None else f"**{s['speedup']:.2f}x**"
        lines.append(f"| {cell.upper()} | {fmt(t)} | {fmt(o)} | {speedup} |")
    return "\n".join(lines)


def section(doc: dict) -> str:
    """The generated section of ``docs/benchmarks.md`` (markers included) for the results ``doc``."""
    env = doc["environment"]
    b, t, f, h = doc["shape"].split(",")
    failed = [r["test"] for r in doc["rows"] if r["outcome"] != "passed" and not r["outcome"].startswith("skipped")]
    skipped = sorted({f"{r['backend']}: {r['outcome']}" for r in doc["rows"] if r["outcome"].startswith("skipped")})
    return (
        f"{BEGIN}\n\n### TorchRL's recurrent-backend benchmark, both libraries (`bench_torchrl_reset.py`)\n\n"
        f"pytorch/rl's `{TEST_FILE}` (revision {doc['rl_revision']}) run as it is, each test with TorchRL's "
        f"modules and with ours swapped in, in one process: a rollout with 3% intermediate resets, recurrent mode, "
        f"`inference_mode`, B={b}, T={t}, F={f}, H={h}; compiled variants through TorchRL's `compile_with_warmup` "
        f"(a default `torch.compile`). {env['device_name']}, {env['torch_threads']} torch threads, torch "
        f"{env['torch']}, torchrl {env['torchrl']}. Milliseconds per call from pytest-benchmark.\n\n{table(doc)}\n\n"
        + (f"Variants that failed: {', '.join(failed)}.\n\n" if failed else "No variant of either library failed.")
        + (f" Skipped by the benchmark itself: {'; '.join(skipped)}.\n\n" if skipped else "\n\n")
        + f"```bash\npython benchmarks/bench_torchrl_reset.py --rl PATH_TO_PYTORCH_RL\n```\n\n{END}"
    )


def report(path: Path) -> None:
    """Print the table and rewrite the generated section of the docs page from the JSON at ``path``."""
    doc = json.loads(path.read_text())
    print(table(doc))
    write_section(DOC_PAGE, BEGIN, END, section(doc))
    print(f"wrote {DOC_PAGE}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rl", type=Path, help="a pytorch/rl checkout or git directory")
    ap.add_argument("--shape", default="64,64,32,128", help="B,T,F,H (TORCHRL_RNN_RESET_BENCHMARK_SHAPES)")
    ap.add_argument("--min-rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", action="store_true", help="no timing: table and docs section from --out")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or RESULTS / f"torchrl_reset_{device}.json"
    if not args.report:
        if args.rl is None:
            ap.error("--rl PATH is required to run the benchmark")
        doc = run(args.rl, args.shape, args.min_rounds)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
    report(out)


if __name__ == "__main__":
    main()
