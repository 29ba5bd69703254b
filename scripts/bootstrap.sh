#!/usr/bin/env bash
# Create .venv and install repro with its test tools. CPU machines get the CPU build of torch;
# set REPRO_TORCH (e.g. "torch==2.11.0") to choose another build, or pre-install one in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "${REPRO_TORCH:-torch==2.13.0}"
fi
.venv/bin/pip install -q -e ".[dev]"
