"""TorchRL's own benchmark of its recurrent backends (pytorch/rl's
``benchmarks/test_rnn_reset_backends_benchmark.py``), run as it is with TorchRL's ``LSTMModule``/``GRUModule`` and
again with ours swapped in (``torchrl_swap_plugin.py``), in one pytest-benchmark process.

The test: a ``[B, T]`` rollout with 3% intermediate resets in recurrent mode under ``inference_mode``, backends
``cudnn`` (``pad``), ``scan`` (and ``triton`` on CUDA), eager and compiled with TorchRL's ``compile_with_warmup``.
``--rl PATH``: a pytorch/rl checkout or git directory; its two files are read at run time into a temporary folder,
never copied here. Shape B=64, T=64, F=32, H=128 (``--quick``: T=16). One row per cell and variant: both
libraries' median ms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("benchmarks/test_rnn_reset_backends_benchmark.py", "benchmarks/conftest.py")
OURS = "ours"
BASELINES = ("torchrl",)


def read(rl: Path, relpath: str) -> str:
    if (rl / relpath).is_file():
        return (rl / relpath).read_text()
    git = rl / ".git" if (rl / ".git").exists() else rl
    shown = subprocess.run(["git", f"--git-dir={git}", "show", f"HEAD:{relpath}"], capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--rl {rl}: cannot read {relpath} ({shown.stderr.strip()}); pass a pytorch/rl checkout")
    return shown.stdout


def rows(args):
    if args.rl is None:
        raise SystemExit("the torchrl suite needs --rl PATH: a pytorch/rl checkout or git directory")
    shape = "64,16,32,128" if args.quick else "64,64,32,128"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for relpath in FILES:
            (tmp / Path(relpath).name).write_text(read(args.rl, relpath))
        env = dict(os.environ, TORCHRL_RNN_RESET_BENCHMARK_SHAPES=shape,
                   PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", Path(FILES[0]).name, "-p", "benchmarks.torchrl_swap_plugin", "-p",
               "no:cacheprovider", "-q", f"--junit-xml={tmp / 'junit.xml'}", f"--benchmark-json={tmp / 'b.json'}",
               f"--benchmark-min-rounds={5 if args.quick else 20}"]
        if args.device.type == "cpu":
            cmd += ["-k", "not triton"]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        print(proc.stdout[-3000:], proc.stderr[-2000:], sep="\n")
        cases = {c.get("name"): next((p.tag for p in c if p.tag in ("failure", "error", "skipped")), None)
                 for c in ET.parse(tmp / "junit.xml").getroot().iter("testcase")}
        timed = json.loads((tmp / "b.json").read_text())["benchmarks"] if (tmp / "b.json").exists() else []
    median = {b["name"]: b["stats"]["median"] * 1e3 for b in timed}
    variants: dict[tuple, dict] = {}
    for name, problem in sorted(cases.items()):
        ids = name[name.index("[") + 1:-1].split("-")
        library = "ours" if "ours" in ids else "torchrl"
        cell, backend = next(i for i in ids if i in ("lstm", "gru")), next(i for i in ids if i in ("cudnn", "scan", "triton"))
        entry = variants.setdefault((cell, backend, "True" in ids), {"ms": {}, "errors": {}})
        if name in median:
            entry["ms"][library] = round(median[name], 4)
        else:
            entry["errors"][library] = problem or "not timed"
    for (cell, backend, compiled), entry in variants.items():
        yield {"case": dict(cell=cell, backend=backend, compiled=compiled, shape=shape), **entry}
