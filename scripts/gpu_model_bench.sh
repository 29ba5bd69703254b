#!/usr/bin/env bash
# Model-level benchmark on the device machine (one H200): the static decoder's GPU tests, then
# `repro bench model` at the GDN-1.3B and Qwen3.6-27B shapes. Run from the repository root with the
# fla wheels carried in .whl/ (carry: [".whl"]); about 8 minutes (all GPU tests <= 4, bench <= 190 s of rows
# plus setup), every stage time-limited so that the whole stays under 10 minutes.
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
  echo "== pytest -m gpu tests/ (kernels, chain path, static decoder: graphed vs eager vs HybridLM)"
  timeout 240 python3 -m pytest -m gpu -rsP -q -p no:cacheprovider tests/ --junitxml="$OUT/gpu-tests.xml"
  status=$?
  echo "== pytest exit $status"
  echo "== repro bench model"
  # rows not started within the budget are recorded as skipped; report, table and figure are rewritten
  # after each shape, so a run cut short still leaves them
  timeout 300 python3 -m repro bench model --shape gdn-1.3b,qwen3.6-27b --out "$OUT/bench-model" \
    --figures "$OUT/bench-model/figures" --time-budget 190 "$@"
  echo "== bench exit $?"
  nvidia-smi --query-gpu=memory.used,temperature.gpu,power.draw --format=csv
  date -u +"%F %T UTC"
  exit "$status"
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
tar -czf "$OUT/bench-model.tar.gz" -C "$OUT" bench-model gpu_model_bench.log gpu-tests.xml 2>/dev/null
exit "$status"
