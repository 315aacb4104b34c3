"""examples/backends_agree.py (README's first check) runs as a user runs it, in a subprocess: every backend available
for each cell agrees with ``reference``. It looped over every backend, ``parallel`` included, and stopped at the LSTM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rnn_functional as rf

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "backends_agree.py"


def test_backends_agree_example_runs_every_backend_of_each_cell():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "all backends agree"
    for name, cell in (("LSTM", "lstm"), ("GRU", "gru")):
        ran = {line.split()[1] for line in lines if line.startswith(f"{name} ")}
        assert ran == {*rf.available_backends(cell=cell), "auto"} - {"reference"}, (name, ran)
