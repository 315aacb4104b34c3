#!/usr/bin/env bash
# Installs everything from nothing (scripts/install.sh), then runs the whole test suite
# (tests/ and compile_tests/) with Triton kernels in interpreter mode on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export TRITON_INTERPRET=1
python -m pytest -q -p no:cacheprovider "$@"
