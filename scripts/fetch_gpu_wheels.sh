#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels the GPU machine lacks (Python 3.12, manylinux x86_64,
# no network there: docs/gpu.md): tensordict and torchrl at the versions installed here, and their
# requirements missing from that machine's image. Run where the package index is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
version() { "$PYTHON" -m pip show "$1" | sed -n 's/^Version: //p'; }
WANTED=(
    "tensordict==$(version tensordict)" "torchrl==$(version torchrl)"
    # their requirements absent from the GPU image (torch, numpy, packaging, cloudpickle are there)
    "hoptorch==$(version hoptorch)" "pyvers==$(version pyvers)" "orjson==$(version orjson)"
    "importlib_metadata==$(version importlib_metadata)" "lazy-importer==$(version lazy-importer)"
)
rm -rf .whl && mkdir .whl
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WANTED[@]}" 2> >(grep -v "is ignored" >&2)
size=$(du -sm .whl | cut -f1)
ls -1 .whl
echo "${size} MiB in .whl (the device tool carries at most 64 MiB with the working tree)"
[ "$size" -le 48 ] || { echo "too large to carry" >&2; exit 1; }
