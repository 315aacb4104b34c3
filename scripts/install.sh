#!/usr/bin/env bash
# Creates ./.venv if needed and installs the pinned CPU torch first, then the package with its
# test extra, under a constraint that keeps pip from ever resolving another torch. Skips all of
# it when .venv was installed from the same pyproject.toml and install.sh (a hash of both is
# kept in .venv/install-stamp); FORCE_INSTALL=1 reinstalls anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STAMP=.venv/install-stamp
wanted=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ "${FORCE_INSTALL:-0}" != 1 ] && [ -x .venv/bin/python ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ]; then
    echo ".venv is up to date (FORCE_INSTALL=1 to reinstall)"
    exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
echo "torch==2.13.0" > .venv/torch-constraint.txt
# PYTHONWARNINGS: setuptools' editable-build deprecation banners are about our build config, not the user's install
PIP_CONSTRAINT=.venv/torch-constraint.txt PYTHONWARNINGS=ignore python -m pip install -q -e ".[test]"
echo "$wanted" > "$STAMP"
