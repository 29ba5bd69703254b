#!/usr/bin/env bash
# Every route on the GPU with the trained default family (experiments gpu-smoke.yaml: the fused Triton
# GDN kernels behind HybridLM, each route's tokens hashed against AR): float32, where greedy
# speculation must reproduce AR token for token, then bf16, where divergences are reported as
# "diverged at token k". Run from the repository root on the device machine with the fla wheels in
# .whl/ (carry: [".whl"]); each dtype is time-limited (ROUTES_TIMEOUT, 150 s) and writes its records as
# it goes, so a run cut short keeps what it did.
# Environment: OUT, LIMIT (prompts per suite, 2), ROUTES_TIMEOUT, REPRO_GIT_SHA=<sha of the checkout>.
# Results: $OUT/gpu-routes.log and $OUT/gpu-routes.tar.gz (float32/ and bfloat16/: records.jsonl,
# manifest.json, report and table of `repro run`).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-routes}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
{
  status=0
  for dtype in float32 bfloat16; do
    echo "== repro run gpu-smoke --dtype $dtype ($(date -u +%T))"
    timeout "${ROUTES_TIMEOUT:-150}" python3 -m repro run gpu-smoke --dtype "$dtype" --limit "${LIMIT:-2}" \
      --out "/tmp/gpu-routes/$dtype"
    rc=$?
    echo "== $dtype: exit $rc"
    [ $rc -eq 0 ] || status=1
  done
  exit "$status"
} 2>&1 | tee "$OUT/gpu-routes.log"
status=${PIPESTATUS[0]}
tar -czf "$OUT/gpu-routes.tar.gz" -C /tmp gpu-routes 2>/dev/null
save_triton_cache "$OUT"
exit "$status"
