#!/usr/bin/env bash
# Model-level benchmark on the device machine (one H200): the gpu-marked tests (scripts/gpu_tests.sh: one
# file at a time, each time-limited, verbose, junit xml per file), then `repro bench model` at the
# GDN-1.3B and Qwen3.6-27B shapes. Run from the repository root with the fla wheels carried in .whl/
# (carry: [".whl"]). About 8 minutes: setup ~20 s, tests ~335 s (each file limited, 640 s at most),
# bench <= BENCH_TIMEOUT (240 s; rows start within BENCH_BUDGET = 180 s). The limits add up to more
# than a 10-minute device call: when time is short, pass GPU_TEST_FILES or GPU_TEST_TIMEOUT.
# Environment: OUT, GPU_TEST_TIMEOUT (seconds per test file; see gpu_tests.sh), GPU_TESTS=0 (skip the
# tests), GPU_TEST_FILES (a space-separated subset), TUNE_TREE=1 (also the tree kernel's tile sweep,
# scripts/tune_tree_kernel.py, into the tarball's tune-tree/, at most TUNE_TIMEOUT = 200 s), BENCH_BUDGET,
# BENCH_TIMEOUT, REPRO_GIT_SHA=<sha of the checkout sent> (the device copy has no
# .git; the manifest names the code with it).
# Results in $OUT: gpu_model_bench.log (everything printed, with a full traceback for every failed bench
# row), bench-model/ (records.jsonl, manifest.json, report.md, table.csv, figures/model_verify_vs_T.png)
# and bench-model.tar.gz (all of it, plus gpu-tests/junit-*.xml and tune-tree/ when swept).
# repro is not installed there: it runs from the checkout through PYTHONPATH.
# Extra arguments go to `repro bench model` (e.g. --shapes gdn-1.3b --no-compile).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-model-bench}
mkdir -p "$OUT"
LOG="$OUT/gpu_model_bench.log"
JUNIT=/tmp/gpu-tests  # into the tarball only: at most 8 files come back from $OUT
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
{
  date -u +"%F %T UTC"
  echo "REPRO_GIT_SHA=${REPRO_GIT_SHA:-unset}"
  python3 -c 'import sys, torch, triton, fla; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| triton", triton.__version__, "| fla", fla.__version__, "| cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  status=0
  if [ "${GPU_TESTS:-1}" != 0 ]; then
    # junit files stay out of $OUT (at most 8 files come back from it): they travel in the tarball
    # GPU_TEST_FILES="tests/a.py tests/b.py" runs those files only (word-split on purpose)
    # shellcheck disable=SC2086
    OUT=/tmp/gpu-tests bash scripts/gpu_tests.sh ${GPU_TEST_FILES:-}
    status=$?
    echo "== gpu tests exit $status ($(date -u +%T))"
  fi
  if [ "${TUNE_TREE:-0}" = 1 ]; then  # the tree kernel's tile sweep (scripts/tune_tree_kernel.py)
    echo "== tree kernel tile sweep"
    timeout "${TUNE_TIMEOUT:-200}" python3 scripts/tune_tree_kernel.py /tmp/tune-tree  # tarball only
    echo "== tune exit $?"
  fi
  echo "== repro bench model"
  # rows not started within the budget are recorded as skipped; report, table and figure are rewritten
  # after each shape, so a run cut short still leaves them
  timeout "${BENCH_TIMEOUT:-240}" python3 -m repro bench model --shapes gdn-1.3b,qwen3.6-27b \
    --out "$OUT/bench-model" --figures "$OUT/bench-model/figures" --time-budget "${BENCH_BUDGET:-180}" "$@"
  echo "== bench exit $?"
  nvidia-smi --query-gpu=memory.used,temperature.gpu,power.draw --format=csv
  date -u +"%F %T UTC"
  exit "$status"
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
tar -czf "$OUT/bench-model.tar.gz" -C "$OUT" bench-model gpu_model_bench.log \
  -C /tmp gpu-tests $([ -d /tmp/tune-tree ] && echo tune-tree) 2>/dev/null
save_triton_cache "$OUT"
exit "$status"
