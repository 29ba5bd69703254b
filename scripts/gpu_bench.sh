#!/usr/bin/env bash
# Kernel benchmarks on the device machine (one H200): the GPU tests, then `repro bench kernels`.
# Run from the repository root with the fla wheels carried in .whl/ (carry: [".whl"]); results go
# to $OUT (bench-kernels/ with records, manifest, report, table, figures/, and one log).
# repro is not installed there: it runs from the checkout through PYTHONPATH. Extra arguments are
# passed to `repro bench kernels` (e.g. --shapes specla --sizes 16,64). The device copy has no .git:
# set REPRO_GIT_SHA=$(git rev-parse HEAD) in the command so that manifests name the code.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-bench}
mkdir -p "$OUT"
LOG="$OUT/gpu_bench.log"
export PYTHONUNBUFFERED=1
{
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  date -u +"%F %T UTC"
  git rev-parse HEAD 2>/dev/null || true
  python3 -c 'import sys, torch, triton, fla; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| triton", triton.__version__, "| fla", fla.__version__, "| cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  echo "== pytest -m gpu"
  timeout 150 python3 -m pytest -m gpu -x -q -p no:cacheprovider tests/
  status=$?
  echo "== pytest exit $status"
  echo "== repro bench kernels"
  # rows not started after 240 s are recorded as skipped, so the report and figures are always written
  timeout 400 python3 -m repro bench kernels --out "$OUT/bench-kernels" --budget-s 240 "$@"
  echo "== bench exit $?"
  exit "$status"
} 2>&1 | tee "$LOG"
