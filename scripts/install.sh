#!/usr/bin/env bash
# Creates ./.venv if needed and installs the pinned CPU torch first, then the package with
# its test extra, under a constraint that keeps pip from ever resolving another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
echo "torch==2.13.0" > .venv/torch-constraint.txt
PIP_CONSTRAINT=.venv/torch-constraint.txt python -m pip install -q -e ".[test]"
