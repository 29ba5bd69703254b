#!/usr/bin/env bash
# The graphed decode engine on the GPU: its gpu-marked tests (tests/models/test_graphed.py and the static
# decoder's), then `repro run gpu-smoke` in bf16 with --engine graphed and --engine eager (each under
# ROUTES_TIMEOUT, records written as they go), then the graphs' device times (scripts/gpu_engine_timing.py).
# Run from the repository root on the device machine with the fla wheels in .whl/ (carry: [".whl"]).
# Environment: OUT, LIMIT (prompts per suite, 2), ROUTES_TIMEOUT (170 s), TEST_FILES (the two above),
# REPRO_GIT_SHA=<sha>.
# Results: $OUT/gpu-engine.log, $OUT/gpu-engine.tar.gz (tests/, graphed/, eager/, timing.json) and the two
# report.md files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-engine}
mkdir -p "$OUT" /tmp/gpu-engine
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  status=0
  # shellcheck disable=SC2086
  OUT=/tmp/gpu-engine/tests bash scripts/gpu_tests.sh \
    ${TEST_FILES:-tests/models/test_graphed.py tests/models/test_static_decoder.py} || status=1
  for engine in graphed eager; do
    echo "== repro run gpu-smoke --dtype bfloat16 --engine $engine ($(date -u +%T))"
    timeout "${ROUTES_TIMEOUT:-170}" python3 -m repro run gpu-smoke --device cuda --dtype bfloat16 \
      --engine "$engine" --limit "${LIMIT:-2}" --out "/tmp/gpu-engine/$engine"
    echo "== $engine: exit $?"
  done
  echo "== graph timing ($(date -u +%T))"
  timeout 90 python3 scripts/gpu_engine_timing.py bfloat16 | tee /tmp/gpu-engine/timing.json
  exit "$status"
} 2>&1 | tee "$OUT/gpu-engine.log"
status=${PIPESTATUS[0]}
find /tmp/gpu-engine -name '*.lock' -delete
tar -czf "$OUT/gpu-engine.tar.gz" -C /tmp gpu-engine 2>/dev/null
save_triton_cache "$OUT"
for engine in graphed eager; do cp "/tmp/gpu-engine/$engine/report.md" "$OUT/report-$engine.md" 2>/dev/null; done
exit "$status"
