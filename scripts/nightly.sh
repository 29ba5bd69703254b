#!/usr/bin/env bash
# The nightly job on one rented H100 (runbooks/nightly-h100.md; launched by runbooks/nightly.sky.yaml):
# suites, GPU tests, tree exactness, kernel and model benches, the papers' setups on their real
# checkpoints, upload of the run directories, and `repro compare` against the previous night.
#
#   scripts/nightly.sh [--dry-run]     --dry-run prints every command and runs none (no GPU needed)
#
# Environment (checkpoint directories, downloaded by the sky task's setup):
#   REPRO_NIGHTLY_QWEN          Qwen3.6-27B target          REPRO_NIGHTLY_GDN        GDN-1.3B target (fla)
#   REPRO_NIGHTLY_QWEN_DFLASH   its z-lab DFlash drafter    REPRO_NIGHTLY_GDN_EAGLE  its EAGLE drafter
#   REPRO_NIGHTLY_QWEN_WEAVER   its Weaver adapter
# and, optional:
#   REPRO_NIGHTLY_DATE     the night's name (default: today, UTC)
#   REPRO_NIGHTLY_RESULTS  local results root (default results/nightly); the night goes to ROOT/DATE
#   REPRO_NIGHTLY_BUCKET   s3://bucket/prefix or gs://bucket/prefix: ROOT/DATE is uploaded to
#                          BUCKET/DATE and BUCKET/latest; the previous night is read from BUCKET/latest
#                          (unset: no upload; the previous night is REPRO_NIGHTLY_PREVIOUS, if given)
#   REPRO_NIGHTLY_PREVIOUS a local folder of the previous night's results (overrides BUCKET/latest)
#   REPRO                  the repro command (default .venv/bin/repro)
#
# Every stage runs even when an earlier one failed; the exit status is 3 when a check failed or the
# comparison found a regression, 1 when a stage failed otherwise, 2 on bad set-up, else 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: scripts/nightly.sh [--dry-run]" >&2; exit 2 ;;
esac

REPRO=${REPRO:-.venv/bin/repro}
DATE=${REPRO_NIGHTLY_DATE:-$(date -u +%F)}
ROOT=${REPRO_NIGHTLY_RESULTS:-results/nightly}
NIGHT=$ROOT/$DATE
BUCKET=${REPRO_NIGHTLY_BUCKET:-}
PREVIOUS=${REPRO_NIGHTLY_PREVIOUS:-}
read -r -a REPRO_CMD <<< "$REPRO"

CHECKPOINTS=(REPRO_NIGHTLY_QWEN REPRO_NIGHTLY_QWEN_DFLASH REPRO_NIGHTLY_QWEN_WEAVER REPRO_NIGHTLY_GDN
             REPRO_NIGHTLY_GDN_EAGLE)
for var in "${CHECKPOINTS[@]}"; do
  if [ -z "${!var:-}" ]; then
    if [ $DRY -eq 1 ]; then
      printf -v "$var" '%s' "\$$var"  # dry run: print the variable's name in its place
    else
      echo "error: $var is not set (a checkpoint directory; see runbooks/nightly-h100.md)" >&2; exit 2
    fi
  fi
done
case "$BUCKET" in  # the bucket's own client mirrors a folder (the sky task installs it)
  "" ) SYNC=() ;;
  s3://*) SYNC=(aws s3 sync --delete --only-show-errors) ;;
  gs://*) SYNC=(gsutil -m -q rsync -r -d) ;;
  *) echo "error: REPRO_NIGHTLY_BUCKET must start with s3:// or gs://, got $BUCKET" >&2; exit 2 ;;
esac

STATUS=0
stage() {  # stage NAME CMD...: print, run (unless --dry-run), remember the worst exit status
  local name=$1; shift
  printf '+ %s\n' "$*"
  [ $DRY -eq 1 ] && return 0
  echo "== $name ($(date -u +%T))" >&2
  "$@"
  local rc=$?
  if [ $rc -eq 3 ]; then STATUS=3; elif [ $rc -ne 0 ] && [ $STATUS -ne 3 ]; then STATUS=1; fi
  [ $rc -eq 0 ] || echo "== $name failed (exit $rc)" >&2
  return 0
}

[ $DRY -eq 1 ] || mkdir -p "$NIGHT"
stage suites "${REPRO_CMD[@]}" suites verify
stage gpu-tests env OUT="$NIGHT/gpu-tests" scripts/gpu_tests.sh
stage tree-exactness "${REPRO_CMD[@]}" falsify tree-exactness --device cuda --backend triton \
  --out "$NIGHT/falsify-tree-exactness"
stage bench-kernels "${REPRO_CMD[@]}" bench kernels --shapes weaver,specla --out "$NIGHT/bench-kernels"
stage bench-model "${REPRO_CMD[@]}" bench model --shapes gdn-1.3b,qwen3.6-27b --out "$NIGHT/bench-model"
QWEN_ARGS=(--target "$REPRO_NIGHTLY_QWEN" --drafter "$REPRO_NIGHTLY_QWEN_DFLASH" --weaver "$REPRO_NIGHTLY_QWEN_WEAVER")
GDN_ARGS=(--target "$REPRO_NIGHTLY_GDN" --drafter "$REPRO_NIGHTLY_GDN_EAGLE")
stage qwen-check "${REPRO_CMD[@]}" run qwen36-27b-weaver --check "${QWEN_ARGS[@]}"
stage gdn-check "${REPRO_CMD[@]}" run gdn-1.3b-specla --check "${GDN_ARGS[@]}"
stage qwen36-27b-weaver "${REPRO_CMD[@]}" run qwen36-27b-weaver "${QWEN_ARGS[@]}" --out "$NIGHT/qwen36-27b-weaver"
stage gdn-1.3b-specla "${REPRO_CMD[@]}" run gdn-1.3b-specla "${GDN_ARGS[@]}" --out "$NIGHT/gdn-1.3b-specla"
# the paper tables ship for the tiny family (float64, 3 prompts x 64 tokens); on real checkpoints they run as
# the templates do: bf16 (a 27B model in float64 needs 216 GB), 16 prompts a suite x 256 tokens
PAPER_SCALE=(--dtype bfloat16 --limit 16 --max-new-tokens 256)
stage table2 "${REPRO_CMD[@]}" run table2 "${QWEN_ARGS[@]}" "${PAPER_SCALE[@]}" --out "$NIGHT/table2"
stage specla "${REPRO_CMD[@]}" run specla "${GDN_ARGS[@]}" "${PAPER_SCALE[@]}" --out "$NIGHT/specla"

if [ -z "$PREVIOUS" ] && [ -n "$BUCKET" ]; then
  PREVIOUS=$ROOT/previous
  [ $DRY -eq 1 ] || mkdir -p "$PREVIOUS"
  stage fetch-previous "${SYNC[@]}" "$BUCKET/latest" "$PREVIOUS"
fi
# a first night (an empty BUCKET/latest) has nothing to compare against: compare would refuse it (exit 2)
if [ -n "$PREVIOUS" ] && { [ $DRY -eq 1 ] || find "$PREVIOUS" -name manifest.json -print -quit | grep -q .; }; then
  stage compare "${REPRO_CMD[@]}" compare "$PREVIOUS" "$NIGHT" --out "$NIGHT/COMPARE.md"
elif [ -n "$PREVIOUS" ]; then
  echo "no run in the previous night's $PREVIOUS (a first night?): comparison skipped" >&2
else
  echo "no previous night (set REPRO_NIGHTLY_BUCKET or REPRO_NIGHTLY_PREVIOUS): comparison skipped" >&2
fi
if [ -n "$BUCKET" ]; then
  stage upload "${SYNC[@]}" "$NIGHT" "$BUCKET/$DATE"
  stage upload-latest "${SYNC[@]}" "$NIGHT" "$BUCKET/latest"
fi
[ $DRY -eq 1 ] || echo "night $DATE: results in $NIGHT, exit $STATUS" >&2
exit $STATUS
