#!/usr/bin/env bash
# Installs every wheel in DIR (default .whl) into TARGET (default /tmp/rf_site) without an index or
# dependency resolution (the GPU machine reaches no network; the wheels were chosen by
# scripts/fetch_gpu_wheels.sh), then prints the PYTHONPATH entry to use.
set -euo pipefail
DIR=${1:-.whl}
TARGET=${2:-/tmp/rf_site}
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TARGET" "$DIR"/*.whl
echo "$TARGET"
