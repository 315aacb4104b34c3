#!/usr/bin/env bash
# The main job: installs into ./.venv if needed (scripts/install.sh), then trains PPO with a
# recurrent policy and with the memoryless baseline, 3 seeds each, on CartPole-v1 with the
# velocities hidden (examples/ppo_memory.py); results in runs/ppo_memory/. Extra arguments go
# to the script (--quick: the short CI check).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python examples/ppo_memory.py "$@"
