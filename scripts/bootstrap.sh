#!/usr/bin/env bash
# Create .venv and install repro with its test tools. CPU machines get the CPU build of torch;
# set REPRO_TORCH (e.g. "torch==2.11.0") to choose another build, or pre-install one in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  pip "${REPRO_TORCH:-torch==2.13.0}"
fi
pip -e ".[dev]"
# flash-linear-attention: its pure-torch naive reference is a test oracle; without --no-deps it
# would pull triton, which only matters on a GPU.
pip --no-deps "fla-core==0.6.0" "flash-linear-attention==0.6.0"
# z-lab's DFlash package: its model class is the oracle for the DFlash checkpoint format (its pins
# are for its own benchmark, hence --no-deps).
pip --no-deps "dflash==0.1.0"
# Triton: the fused GDN kernels run on CUDA; on a CPU machine its interpreter (TRITON_INTERPRET=1)
# still lets the tests check them against the reference.
.venv/bin/python -c "import triton" 2>/dev/null || pip "triton==3.6.0"
.venv/bin/python -c "import repro, torch, transformers" # fail here, not in the tests, if an install broke
