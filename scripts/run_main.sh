#!/usr/bin/env bash
# The main job: installs if needed (scripts/install.sh), then trains recurrent PPO on
# CartPole with masked velocities (examples/ppo_memory.py); extra arguments go to the script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python examples/ppo_memory.py "$@"
