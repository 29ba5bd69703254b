#!/usr/bin/env bash
# Model-level benchmark on the device machine (one H200): the static decoder's GPU tests, then
# `repro bench model` at the GDN-1.3B and Qwen3.6-27B shapes. Run from the repository root with the
# fla wheels carried in .whl/ (carry: [".whl"]); at most about 9.5 minutes (GPU tests <= 60 s per file,
# bench <= 170 s of rows plus setup), every stage time-limited so that the whole stays under 10 minutes.
# Results in $OUT: gpu_model_bench.log (everything printed), bench-model/ (records.jsonl, manifest.json,
# report.md, table.csv, figures/model_verify_vs_T.png) and bench-model.tar.gz (all of it).
# repro is not installed there: it runs from the checkout through PYTHONPATH. The device copy has no
# .git: set REPRO_GIT_SHA=<sha of the checkout sent> so that the manifest names the code.
# Extra arguments go to `repro bench model` (e.g. --shape gdn-1.3b --no-compile).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-model-bench}
mkdir -p "$OUT"
LOG="$OUT/gpu_model_bench.log"
JUNIT=/tmp/gpu-tests  # into the tarball only: at most 8 files come back from $OUT
export PYTHONUNBUFFERED=1
{
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  date -u +"%F %T UTC"
  echo "REPRO_GIT_SHA=${REPRO_GIT_SHA:-unset}"
  python3 -c 'import sys, torch, triton, fla; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| triton", triton.__version__, "| fla", fla.__version__, "| cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  # GPU tests one file at a time, each under its own limit, one line per test (-v) so that a slow
  # or hung file shows where it stopped and cannot hide the others; most exactness-critical first.
  # The first H200 run of all files at once passed 170 s without a result (Triton JIT compiles one
  # kernel variant per tree size and precision). GPU_TEST_FILES / GPU_TEST_LIMIT override.
  status=0
  mkdir -p "$JUNIT"
  for f in ${GPU_TEST_FILES:-test_routes_gpu test_chain_gpu test_static_decoder test_triton_tree test_bench_kernels}; do
    echo "== pytest -m gpu tests/$f.py"
    timeout "${GPU_TEST_LIMIT:-60}" python3 -m pytest -m gpu -v -rs -p no:cacheprovider "tests/$f.py" \
      --junitxml="$JUNIT/$f.xml" -o addopts="" 2>&1 | grep -vE "^\s*$"
    rc=${PIPESTATUS[0]}
    echo "== $f exit $rc"
    [ "$rc" = 0 ] || status=$rc
  done
  echo "== repro bench model"
  # rows not started within the budget are recorded as skipped; report, table and figure are rewritten
  # after each shape, so a run cut short still leaves them
  timeout "${BENCH_LIMIT:-240}" python3 -m repro bench model --shape gdn-1.3b,qwen3.6-27b \
    --out "$OUT/bench-model" --figures "$OUT/bench-model/figures" --time-budget "${BENCH_BUDGET:-170}" "$@"
  echo "== bench exit $?"
  nvidia-smi --query-gpu=memory.used,temperature.gpu,power.draw --format=csv
  date -u +"%F %T UTC"
  exit "$status"
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
tar -czf "$OUT/bench-model.tar.gz" -C "$OUT" bench-model gpu_model_bench.log -C /tmp gpu-tests 2>/dev/null
exit "$status"
