"""The main example (examples/ppo_memory.py) and its torch CartPole (examples/cartpole.py).

* The batched torch CartPole-v1 matches gymnasium's step for step: observations (bitwise, in
  float32), rewards, termination and the 500-step truncation.
* ``--quick`` trains both policies (3 seeds each, the recurrent one compiled with fullgraph=True)
  as a user would, in a subprocess, and the recurrent policy clearly beats the memoryless one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load_cartpole():
    spec = importlib.util.spec_from_file_location("cartpole", EXAMPLES / "cartpole.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _balancing_action(state) -> int:
    """A linear controller on the full state: keeps the pole up for the 500 steps."""
    x, x_dot, theta, theta_dot = state
    return int(3 * theta + theta_dot + 0.1 * x + 0.3 * x_dot > 0)


def test_torch_cartpole_matches_gymnasium_step_for_step() -> None:
    gym = pytest.importorskip("gymnasium")
    import numpy as np

    cartpole = _load_cartpole()
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    steps = torch.tensor(0)
    episodes, truncations, terminations = 0, 0, 0
    while episodes < 40:
        # Even episodes act at random (they terminate early), odd ones balance (they truncate).
        state = np.asarray(env.unwrapped.state, dtype=np.float64)
        action = int(rng.integers(2)) if episodes % 2 == 0 else _balancing_action(state)
        ours = cartpole.step(torch.tensor(state), steps, torch.tensor(action))
        next_state, steps, reward, terminated, truncated = ours
        obs, gym_reward, gym_terminated, gym_truncated, _ = env.step(action)
        assert np.array_equal(next_state.float().numpy(), obs), (episodes, int(steps))
        assert (float(reward), bool(terminated), bool(truncated)) == (gym_reward, gym_terminated, gym_truncated)
        if gym_terminated or gym_truncated:
            episodes += 1
            truncations += gym_truncated
            terminations += gym_terminated
            env.reset()
            steps = torch.tensor(0)
    assert truncations >= 10 and terminations >= 20  # both endings were compared


def test_torch_cartpole_resets_and_initial_states() -> None:
    cartpole = _load_cartpole()
    states = cartpole.initial_state((1000,), generator=torch.Generator().manual_seed(0))
    assert states.dtype == torch.float64 and states.shape == (1000, 4)
    assert states.abs().max() <= cartpole.RESET_BOUND and states.abs().max() > 0.9 * cartpole.RESET_BOUND
    steps = torch.tensor([3, 7])
    state = torch.ones(2, 4, dtype=torch.float64)
    fresh = torch.zeros(2, 4, dtype=torch.float64)
    new_state, new_steps = cartpole.reset_done(state, steps, torch.tensor([True, False]), fresh)
    assert new_state.tolist() == [[0.0] * 4, [1.0] * 4] and new_steps.tolist() == [0, 7]


def test_quick_run_recurrent_beats_memoryless(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "ppo_memory.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output  # --quick exits non-zero when memory does not clearly help
    for noise in ("Warning", "INFO"):
        assert noise not in proc.stdout + proc.stderr, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    recurrent, memoryless = summary["recurrent"], summary["memoryless"]
    assert recurrent["seeds"] == memoryless["seeds"] == [0, 1, 2]
    for run in (recurrent, memoryless):
        assert len(run["greedy_return"]) == len(run["sampled_return"]) == 3
    env = summary["env"]  # what a comparison of two runs needs (seeded returns vary across CPUs and versions)
    assert env["cpu"] and env["torch"] and env["tensordict"] and env["rnn_functional"]
    gap = sum(recurrent["greedy_return"]) / 3 - sum(memoryless["greedy_return"]) / 3
    assert gap > 50, summary
    log = json.loads((tmp_path / "log_recurrent.json").read_text())
    assert log["config"]["policy"] == "recurrent" and len(log["log"]) == log["config"]["iterations"]
    assert "wall time" in proc.stdout.strip().splitlines()[-1]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "ppo_memory.png").stat().st_size > 0
