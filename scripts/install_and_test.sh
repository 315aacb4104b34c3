#!/usr/bin/env bash
# Installs everything from nothing (scripts/install.sh), then runs the whole test suite
# (tests/ and compile_tests/) with Triton kernels in interpreter mode on CPU, on two worker
# processes of one torch thread each (pytest-xdist; a file stays on one worker, so the compiled
# functions its tests share are compiled once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export TRITON_INTERPRET=1
OMP_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25 "$@"
