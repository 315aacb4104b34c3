"""One command for a GPU lease: the GPU tests, then the GPU benchmarks, each within a time budget.

    bash scripts/gpu_check.sh --out DIR              # on a CUDA machine (see docs/gpu.md)
    bash scripts/gpu_check.sh --dry-run --out DIR    # the same steps on CPU: tiny sizes, TRITON_INTERPRET=1

Each step runs as its own process under ``timeout`` with its share of ``--budget-s`` (default 450 s, 7.5
minutes; a lease's command may run 10); a step that overruns is stopped and recorded as such, and the next one
starts. The benchmarks start no row past 70% of their share and rewrite their JSON after every row, so an
overrun loses one row, not the step. Steps: ``tests`` (the GPU-marked tests), ``profile``
(``benchmarks/gpu_profile.py``: host against kernel time of one ``triton`` call), then the benchmark suites
``sequences`` (TorchRL's grid), ``policy``, ``compile``, ``flat`` and ``ensemble`` (``python -m benchmarks SUITE
--device cuda``); ``persistent`` (issue 55, run when asked for: ``gpu_profile.py --persistent``; the first lease's
command is ``bash scripts/gpu_check.sh --steps tests,persistent --budget-s 290 --out
benchmarks/results/gpu_<device>_<date>``). Writes into ``DIR`` (at most 8 files, what the device tool brings back): ``gpu_check.json``
(the environment: device, driver, torch, triton, CPU, library versions; every step's command, exit
status, wall time and output tail), ``summary.md`` (the same as a table), and each benchmark step's
own JSON. The dry run writes the same files on CPU; the test suite runs it
(``tests/test_gpu_check.py``), so the command is known to work before any GPU is seen.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    budget_s: int
    output: str | None = None  # the JSON the step writes into the output folder
    env: tuple[tuple[str, str], ...] = ()


# each step's share of the total budget; a benchmark starts no row after 70% of its share (``--budget-s``) and
# rewrites its JSON after every row, so that the step's hard limit, its share, loses at most the row in flight
SHARES = {"tests": 0.15, "persistent": 0.3, "profile": 0.08, "sequences": 0.30, "policy": 0.10, "compile": 0.12,
          "flat": 0.13, "ensemble": 0.12}
SUITES = ("sequences", "policy", "compile", "flat", "ensemble")  # python -m benchmarks SUITE, one step each
ROW_BUDGET = 0.7
DEFAULT_STEPS = tuple(name for name in SHARES if name != "persistent")  # issue 55's grid runs when asked for


def steps(out: Path, dry_run: bool, total_s: float, only: tuple[str, ...] = DEFAULT_STEPS) -> list[Step]:
    """The steps named in ``only``, in order: tests first (a kernel that fails them makes its timings moot), then a
    profile of one call (host against kernel time), then the benchmarks; each within its share of ``total_s``
    (the shares of ``only`` scaled to fill it)."""
    scale = total_s / sum(SHARES[name] for name in only)
    budget = {name: int(share * scale) for name, share in SHARES.items()}
    return [step for step in _every_step(out, dry_run, budget) if step.name in only]


def _every_step(out: Path, dry_run: bool, budget: dict[str, int]) -> list[Step]:
    """Every step, on CUDA or as the CPU dry run, each with its time limit from ``budget``."""
    py = sys.executable

    def rows(name: str) -> tuple[str, str]:
        return "--budget-s", str(int(ROW_BUDGET * budget[name]))

    # -p no:logging: a failing test's captured torch DEBUG records would bury its message
    pytest = (py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "--tb=short", "-rfEs")

    def suite(name: str, *options: str) -> Step:
        return Step(name, (py, "-m", "benchmarks", name, *options, *rows(name), "--out", str(out / f"{name}.json")),
                    budget[name], f"{name}.json")

    if dry_run:  # each suite's first --quick row on CPU; its compiled and Triton contenders left out (the interpreter
        # takes ~20 s a call; the tests step runs the kernels)
        interp = (("TRITON_INTERPRET", "1"),)
        return [
            Step("tests", (*pytest, "tests/backends/test_triton.py", "-k", "matches_reference_fp64"), budget["tests"],
                 env=interp),
            Step("persistent", (py, "benchmarks/gpu_profile.py", "--smoke", "--persistent", *rows("persistent"),
                                "--out", str(out / "persistent.json")), budget["persistent"], "persistent.json", interp),
            Step("profile", (py, "benchmarks/gpu_profile.py", "--smoke", *rows("profile"), "--out",
                             str(out / "profile.json")), budget["profile"], "profile.json", interp),
            *(suite(name, "--device", "cpu", "--quick", "--rows", "1", "--skip", "compiled|triton") for name in SUITES),
        ]
    return [
        # the GPU-marked tests: compiled kernels against reference, CUDA graphs, CUDA's sync debug mode
        Step("tests", (*pytest, "-m", "gpu", "tests", "compile_tests"), budget["tests"]),
        # issue 55: the flag barrier alone, the persistent kernels against cuDNN (with and without resets) and today's
        # kernels, forward and forward+backward, and the compiled policy step
        Step("persistent", (py, "benchmarks/gpu_profile.py", "--persistent", *rows("persistent"), "--out",
                            str(out / "persistent.json")), budget["persistent"], "persistent.json"),
        Step("profile", (py, "benchmarks/gpu_profile.py", *rows("profile"), "--out", str(out / "profile.json")),
             budget["profile"], "profile.json"),
        # TorchRL's grid (every backend, TorchRL's modules but its autotuned triton, torch.nn), then the policy step,
        # compile, flat batches and an ensemble; each suite's full CUDA grid, cut by its budget. TorchRL's triton
        # autotunes 27 configurations per kernel and shape: on the 2026-12-04 lease the suite with it finished no row
        # in 175 s (benchmarks/results/gpu_h200_2026-12-04); `python -m benchmarks sequences --device cuda` times it.
        *(suite(name, "--device", "cuda", *(("--skip", "torchrl triton") if name == "sequences" else ("--quick",)))
          for name in SUITES),
    ]


def _versions() -> dict:
    """Library versions and the machine, read in a child (the orchestrator itself imports no torch)."""
    code = (
        "import json, platform, torch\n"
        "out = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'python': platform.python_version()}\n"
        "out['device'] = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'\n"
        "for name in ('triton', 'tensordict', 'torchrl', 'numpy'):\n"
        "    try:\n"
        "        out[name] = __import__(name).__version__\n"
        "    except Exception as err:\n"
        "        out[name] = f'missing ({type(err).__name__})'\n"
        "print(json.dumps(out))\n"
    )
    try:
        found = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                          cwd=ROOT, check=True).stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError) as err:
        found = {"error": f"{type(err).__name__}: {err}"}
    try:
        found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        found["driver"] = None
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else None
    settings = {k: v for k, v in os.environ.items() if k.startswith(("TORCH", "PYTORCH", "CUDA", "TRITON", "NVIDIA"))}
    return {**found, "cpu": cpu, "cores": os.cpu_count(), "env": settings}


def run_step(step: Step, out: Path) -> dict:
    env = {**os.environ, **dict(step.env), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    start = time.perf_counter()
    try:
        done = subprocess.run(step.argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=step.budget_s)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        rc = "timeout"
        text = "".join(b.decode(errors="replace") if isinstance(b, bytes) else (b or "") for b in (err.stdout, err.stderr))
    wall = time.perf_counter() - start
    wrote = step.output is not None and (out / step.output).exists()
    return {"name": step.name, "command": " ".join(step.argv), "budget_s": step.budget_s, "rc": rc,
            "wall_s": round(wall, 1), "wrote": step.output if wrote else None, "tail": text[-6000:]}


def summary(doc: dict) -> str:
    env = doc["environment"]
    lines = [f"# gpu_check ({'dry run, CPU' if doc['dry_run'] else 'GPU'})", "",
             f"device {env.get('device')}, driver {env.get('driver')}, torch {env.get('torch')} (CUDA "
             f"{env.get('cuda')}), triton {env.get('triton')}, tensordict {env.get('tensordict')}, torchrl "
             f"{env.get('torchrl')}, Python {env.get('python')}; CPU {env.get('cpu')} ({env.get('cores')} cores)", "",
             "| step | exit | wall s | budget s | wrote |", "|---|---|---:|---:|---|"]
    lines += [f"| {s['name']} | {s['rc']} | {s['wall_s']} | {s['budget_s']} | {s['wrote'] or '-'} |" for s in doc["steps"]]
    lines += ["", f"total {doc['total_s']:.0f} s; every step passed: {doc['ok']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder (created; at most 8 files)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, TRITON_INTERPRET=1")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="the whole run's time, shared among the steps (default 450: 7.5 minutes)")
    ap.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                    help=f"the steps to run, comma-separated (default: {','.join(DEFAULT_STEPS)}; also: persistent); "
                         "a shorter lease can rerun some, the budget shared among them")
    args = ap.parse_args(argv)
    only = tuple(args.steps.split(","))
    unknown = [name for name in only if name not in SHARES]
    if unknown:
        ap.error(f"--steps: unknown step(s) {unknown}; expected names from {list(SHARES)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = []
    for step in steps(out, args.dry_run, args.budget_s, only):
        results.append(run_step(step, out))
        print(f"[{time.perf_counter() - start:6.1f}s] {step.name}: exit {results[-1]['rc']} in "
              f"{results[-1]['wall_s']} s", flush=True)
    doc = {"dry_run": args.dry_run, "environment": _versions(), "steps": results,
           "total_s": time.perf_counter() - start, "ok": all(s["rc"] == 0 for s in results)}
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1))
    (out / "summary.md").write_text(summary(doc))
    print(summary(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
