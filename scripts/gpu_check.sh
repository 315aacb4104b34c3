#!/usr/bin/env bash
# One command for a GPU lease (docs/gpu.md): installs the carried wheels that the machine lacks
# (.whl/, made by scripts/fetch_gpu_wheels.sh on a machine with the package index), then runs
# benchmarks/gpu_check.py: the GPU tests and benchmarks, each within its time budget, results in --out.
#   bash scripts/gpu_check.sh --out DIR             (CUDA)
#   bash scripts/gpu_check.sh --dry-run --out DIR   (the same steps on CPU, tiny sizes)
#   bash scripts/gpu_check.sh --steps tests,persistent --budget-s 290 --out benchmarks/results/gpu_<device>_<date>
#       (issue 55's first lease, under 5 minutes: the GPU tests, then the persistent kernels against cuDNN)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PYTHON" -c "import tensordict, torchrl" 2>/dev/null; then
    site=$(PYTHON="$PYTHON" bash scripts/install_carried_wheels.sh .whl /tmp/rf_site)
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
