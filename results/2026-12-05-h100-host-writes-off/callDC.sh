#!/bin/bash
# callDC: the smoke routes now include SpecLA and FLA-SD (all six paper routes): their GPU test on the eager and
# graphed engines (float32 == AR), then `repro run gpu-smoke --device cuda` (float32, graphed) and its bf16 twin.
# usage: bash callDC.sh SHA    carry: [".whl", "callDC.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDC; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDC.tar.gz -C /tmp callDC; }
T0=$(date +%s); date
timeout -s INT -k 5 200 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/decoding/test_routes_gpu.py \
  > $W/logs/test_routes_gpu.log 2>&1; echo "tests exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
for dt in float32 bfloat16; do
  LEFT=$(( 200 + 170 * $([ $dt = float32 ] && echo 0 || echo 1) + 170 - ($(date +%s) - T0) ))
  timeout -s INT $LEFT python3 -m repro run gpu-smoke --device cuda --dtype $dt --out $W/gpu-smoke-$dt > $W/gpu-smoke-$dt.log 2>&1
  echo "rc=$?" >> $W/gpu-smoke-$dt.log; grep "| all" $W/gpu-smoke-$dt/report.md | head -14; tail -2 $W/gpu-smoke-$dt.log; pack
done
save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
