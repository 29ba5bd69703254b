#!/bin/bash
# callEA: engine.PIPELINE_DEPTH (ab4bbcc): routes A/B default / depth2 / depth3 first, then the GPU tests of the
# pipelined routes at depths 1 and 2 (float32 == AR on CUDA graphs, tagged stores and stream copies; captures
# between a launch and its read), then `repro run routes` at depth 2 and at the default (depth 1) on the same
# machine (paired by `repro compare`), as far as LIMIT seconds ($2) allow.
# carry: [".whl", "callEA.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-580}
source scripts/gpu_env.sh
W=/tmp/callEA; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callEA.tar.gz -C /tmp callEA; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
ROUTES_AB_BUDGET_S=$(( $(cap 160) - 20 )) ROUTES_AB_VARIANTS=default,depth2,depth3 timeout -s INT $(cap 160) \
  python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -22; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
L=$(cap 230); if [ "$L" -gt 60 ]; then
  timeout -s INT -k 5 $L python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/decoding/test_pipelined.py \
    -k "equal_ar_in_float32_on_cuda_graphs or captures_between" > $W/logs/test_pipelined.log 2>&1; echo "tests exit $?"
  grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt
  grep -hE "^E  " $W/logs/*.log | head -10
fi
echo "t=$(( $(date +%s) - T0 ))"; pack
run() {  # name, limit seconds, repro run args...
  local name=$1 lim; lim=$(cap $2); shift 2
  [ "$lim" -lt 40 ] && { echo "== $name: no time left"; return; }
  echo "== $name (limit $lim s, t=$(( $(date +%s) - T0 )))"
  timeout -s INT -k 10 $lim python3 -m repro run "$@" --device cuda --dtype bfloat16 --engine graphed \
    --out $W/$name > $W/$name.log 2>&1; echo "rc=$?" >> $W/$name.log
  tail -2 $W/$name.log; grep -E "^\| all" $W/$name/report.md 2>/dev/null | head -14
  pack
}
run routes-depth2 150 routes --set switches.pipeline_depth=2
run routes 150 routes
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
