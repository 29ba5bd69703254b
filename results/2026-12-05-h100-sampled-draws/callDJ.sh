#!/bin/bash
# callDJ: sampled AR's fixed cost a generation (scripts/gpu/sampled-ar.py); the growth test at HEAD.
# carry: [".whl", "callDJ.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDJ; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT 200 python3 scripts/gpu/sampled-ar.py $W/sampled-ar > $W/sampled-ar.log 2>&1; echo "sampled-ar exit $?"
grep "^{" $W/sampled-ar.log; grep -E "Error" $W/sampled-ar.log | head
echo "t=$(( $(date +%s) - T0 ))"
GPU_TEST_JOBS=1 OUT=$W/tests timeout -s INT -k 10 200 bash scripts/gpu_tests.sh tests/drafters/test_weaver_growth_fused.py > $W/gpu_tests.log 2>&1; echo "gpu_tests exit $?"
grep -E "^== |passed|failed" $W/gpu_tests.log | tail -5
tar czf $OUT/callDJ.tar.gz -C /tmp callDJ
echo "t=$(( $(date +%s) - T0 ))"; date
