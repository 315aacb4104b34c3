#!/usr/bin/env bash
# Installs everything from nothing into ./.venv (pinned CPU torch first, so pip never
# resolves an unpinned torch), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
# The constraint keeps every later resolution (torchrl, tensordict, ...) on that torch.
echo "torch==2.13.0" > .venv/torch-constraint.txt
PIP_CONSTRAINT=.venv/torch-constraint.txt python -m pip install -q -e ".[test]"
export TRITON_INTERPRET=1
python -m pytest -q -p no:cacheprovider "$@"
