#!/usr/bin/env bash
# One device call that checks and measures a change set: the gpu-marked tests of the given files (each
# under its own limit, scripts/gpu_tests.sh), every benchmark script scripts/gpu/*.py (each writes into
# its own folder, under SCRIPT_TIMEOUT), then `repro run` of EXPERIMENT on the graphed engine in bf16.
# Run from the repository root on the device machine with the fla wheels in .whl/ (carry: [".whl"]).
#
#   TEST_FILES="tests/a.py tests/b.py" SCRIPTS="dev-engine dev-dflash" EXPERIMENT=gpu-smoke \
#     bash scripts/gpu_session.sh
#
# Environment: OUT (results; default runs/gpu-session), TEST_FILES (default none), SCRIPTS (names under
# scripts/gpu/, default all), SCRIPT_TIMEOUT (100 s), EXPERIMENT (none: skip), LIMIT (2), RUN_TIMEOUT
# (200 s), RUN_ARGS (extra `repro run` options), REPRO_GIT_SHA (put the sha in the command literally: the
# device copy's .git can be stale, so `git rev-parse` there names an older commit). Results: $OUT/session.log and
# $OUT/session.tar.gz (tests/, scripts/<name>/, run/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-session}
WORK=/tmp/gpu-session
mkdir -p "$OUT" "$WORK"
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  status=0
  if [ -n "${TEST_FILES:-}" ]; then
    # shellcheck disable=SC2086
    OUT=$WORK/tests bash scripts/gpu_tests.sh $TEST_FILES || status=1
  fi
  names=${SCRIPTS:-$(cd scripts/gpu && ls ./[!_]*.py 2>/dev/null | sed 's|./||; s|\.py$||')}  # _*: modules
  for name in $names; do
    echo "== scripts/gpu/$name.py ($(date -u +%T))"
    mkdir -p "$WORK/scripts/$name"
    timeout "${SCRIPT_TIMEOUT:-100}" python3 "scripts/gpu/$name.py" "$WORK/scripts/$name" || {
      echo "== $name: exit $?"; status=1; }
  done
  if [ -n "${EXPERIMENT:-}" ]; then
    echo "== repro run $EXPERIMENT --engine graphed --dtype bfloat16 ($(date -u +%T))"
    # shellcheck disable=SC2086
    timeout "${RUN_TIMEOUT:-200}" python3 -m repro run "$EXPERIMENT" --device cuda --dtype bfloat16 \
      --engine graphed --limit "${LIMIT:-2}" --out "$WORK/run" ${RUN_ARGS:-} || { echo "== run: exit $?"; status=1; }
  fi
  exit "$status"
} 2>&1 | tee "$OUT/session.log"
status=${PIPESTATUS[0]}
find "$WORK" -name '*.lock' -delete
tar -czf "$OUT/session.tar.gz" -C "$WORK" . 2>/dev/null
save_triton_cache "$OUT"
exit "$status"
