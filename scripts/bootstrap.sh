#!/usr/bin/env bash
# Create .venv and install repro with its test tools. torch==2.13.0 as pip resolves it (the CPU wheel where
# pip's wheel folder or index offers one); set REPRO_TORCH (e.g. "torch==2.11.0") to choose another build,
# or pre-install one in .venv.
# Every step fails the script loudly: its output is shown and the step named (a missing fla, dflash
# or triton would otherwise only show up as quietly skipped oracle tests).
set -euo pipefail

# step NAME COMMAND...: run COMMAND, print its output without pip's harmless "WARNING: Location"
# lines, and on failure name the step and exit with the command's status.
step() {
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  if [ -n "$out" ]; then printf '%s\n' "$out" | { grep -v "^WARNING: Location" || true; } >&2; fi
  if [ $rc -ne 0 ]; then
    echo "bootstrap: step '$name' failed (exit $rc): $*" >&2
    exit $rc
  fi
}
pip() { .venv/bin/pip install -q --disable-pip-version-check "$@"; }
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced (tests, .ci/run): define step and pip only

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || step "create .venv" "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  step "install torch" pip "${REPRO_TORCH:-torch==2.13.0}"
fi
step "install repro[dev]" pip -e ".[dev]"
# flash-linear-attention: its pure-torch naive reference is a test oracle; without --no-deps it
# would pull triton, which only matters on a GPU.
step "install flash-linear-attention" pip --no-deps "fla-core==0.6.0" "flash-linear-attention==0.6.0"
# z-lab's DFlash package: its model class is the oracle for the DFlash checkpoint format (its pins
# are for its own benchmark, hence --no-deps).
step "install dflash" pip --no-deps "dflash==0.1.0"
# Triton: the fused GDN kernels run on CUDA; on a CPU machine its interpreter (TRITON_INTERPRET=1)
# still lets the tests check them against the reference.
.venv/bin/python -c "import triton" 2>/dev/null || step "install triton" pip "triton==3.6.0"
# fail here, not in the tests, if an install broke
step "import check" .venv/bin/python -c "import repro, torch, transformers, fla, dflash, triton"
