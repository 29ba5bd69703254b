#!/bin/bash
# callDK: `repro run table2` (bf16, graphed, defaults) after the twin's draws left the clock; the growth test if time is left.
# carry: [".whl", "callDK.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDK; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
left() { echo $(( ${BUDGET:-400} - ($(date +%s) - T0) )); }
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDK.tar.gz -C /tmp callDK; }
timeout -s INT -k 10 $(left) python3 -m repro run table2 --device cuda --dtype bfloat16 --engine graphed \
  --out $W/table2-bf16-graphed > $W/table2.log 2>&1; echo "rc=$?" >> $W/table2.log
tail -2 $W/table2.log; grep -E "^\| all " $W/table2-bf16-graphed/report.md | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
L=$(left); if [ "$L" -gt 60 ]; then
  GPU_TEST_JOBS=1 GPU_TEST_TIMEOUT=$((L - 15)) OUT=$W/tests timeout -s INT -k 10 $L bash scripts/gpu_tests.sh tests/drafters/test_weaver_growth_fused.py > $W/gpu_tests.log 2>&1; echo "gpu_tests exit $?"
  grep -E "passed|failed" $W/gpu_tests.log | tail -3
fi
pack; echo "t=$(( $(date +%s) - T0 ))"; date
