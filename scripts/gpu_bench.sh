#!/usr/bin/env bash
# Kernel benchmarks on the device machine (one H200): the GPU tests, then `repro bench kernels`.
# Run from the repository root with the fla wheels carried in .whl/ (carry: [".whl"]). Results in $OUT:
# gpu_bench.log, report.md (the bench's), the Triton cache, and gpu-bench.tar.gz (gpu-tests/ and
# bench-kernels/ with records, manifest, report, table, figures/): a device call returns at most 8 files,
# none more than two folders down.
# repro is not installed there: it runs from the checkout through PYTHONPATH. Extra arguments are
# passed to `repro bench kernels` (e.g. --shapes specla --sizes 16,64). The device copy has no .git:
# set REPRO_GIT_SHA=$(git rev-parse HEAD) in the command so that manifests name the code.
# Environment: OUT, GPU_TESTS=0 (skip the tests), GPU_TEST_TIMEOUT (per test file, see gpu_tests.sh),
# BENCH_BUDGET (s, default 240), BENCH_TIMEOUT (s, default 400). At most about 8.5 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-bench}
WORK=/tmp/gpu-bench  # what the tarball holds
mkdir -p "$OUT" "$WORK"
LOG="$OUT/gpu_bench.log"
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
{
  date -u +"%F %T UTC"
  git rev-parse HEAD 2>/dev/null || true
  python3 -c 'import sys, torch, triton, fla; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| triton", triton.__version__, "| fla", fla.__version__, "| cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  status=0
  if [ "${GPU_TESTS:-1}" != 0 ]; then  # the kernel tests, one file at a time, each time-limited (<= 90 s)
    OUT="$WORK/gpu-tests" bash scripts/gpu_tests.sh tests/gdn/test_triton_tree.py tests/bench/test_bench_kernels.py
    status=$?
    echo "== gpu tests exit $status"
  fi
  echo "== repro bench kernels"
  # rows not started after BENCH_BUDGET s are recorded as skipped, so the report and figures are always written
  timeout "${BENCH_TIMEOUT:-400}" python3 -m repro bench kernels --out "$WORK/bench-kernels" \
    --time-budget "${BENCH_BUDGET:-240}" "$@"
  echo "== bench exit $?"
  exit "$status"
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
find "$WORK" -name .lock -delete
tar -czf "$OUT/gpu-bench.tar.gz" -C /tmp gpu-bench
cp "$WORK/bench-kernels/report.md" "$OUT/report.md" 2>/dev/null
save_triton_cache "$OUT"
exit "$status"
