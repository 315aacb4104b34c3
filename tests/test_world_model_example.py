"""The world-model example (examples/world_model.py) trains, in its reduced-size mode, to a
held-out one-step loss clearly below the best trivial baseline, and runs its compiled
ensemble imagination rollout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "world_model.py"


def test_world_model_quick_mode_beats_baseline() -> None:
    env = dict(os.environ, WORLD_MODEL_QUICK="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    match = re.search(r"RESULT loss=([0-9.eE+-]+) baseline=([0-9.eE+-]+)", proc.stdout)
    assert match, proc.stdout[-3000:]
    loss, baseline = float(match.group(1)), float(match.group(2))
    assert loss < 0.5 * baseline, proc.stdout  # "clearly below": at most half the best baseline's error
    assert re.search(r"imagination \d+ steps: mse [0-9.]+", proc.stdout), proc.stdout
