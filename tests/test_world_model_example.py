"""The world-model example (examples/world_model.py) trains its ensemble of DreamerV3 block-GRU world models
(its default core) under ``torch.compile``
(the vmapped loss and its backward, ``fullgraph=True``) in its reduced-size mode, to a held-out
one-step loss clearly below the best trivial baseline; checks that the compiled training step
gives the eager step's loss and grads; times both; and runs its compiled imagination rollout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "world_model.py"


def test_world_model_quick_mode_trains_compiled_and_beats_baseline() -> None:
    # the example imports this checkout's rnn_functional, as the test process does
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, WORLD_MODEL_QUICK="1", PYTHONPATH=path)
    command = [sys.executable, str(EXAMPLE), "--compare", "3", "--threads", "1"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"trained 5 members x \d+ steps, core block_gru \(torch\.compile, fullgraph\)", proc.stdout), proc.stdout
    step = re.search(r"TRAIN STEP .*: compiled ([0-9.]+) ms, eager ([0-9.]+) ms .*grads agree", proc.stdout)
    assert step and float(step.group(1)) > 0 and float(step.group(2)) > 0, proc.stdout
    match = re.search(r"RESULT loss=([0-9.eE+-]+) baseline=([0-9.eE+-]+)", proc.stdout)
    assert match, proc.stdout[-3000:]
    loss, baseline = float(match.group(1)), float(match.group(2))
    assert loss < 0.5 * baseline, proc.stdout  # "clearly below": at most half the best baseline's error
    assert re.search(r"imagination \d+ steps: mse [0-9.]+", proc.stdout), proc.stdout
