#!/bin/bash
# callDH: every gpu-marked test file at one commit, 6 files side by side (scripts/gpu_tests.sh): the whole GPU suite's log.
# carry: [".whl", "callDH.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDH; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
GPU_TEST_JOBS=${JOBS:-6} OUT=$W/tests timeout -s INT -k 10 560 bash scripts/gpu_tests.sh ${FILES:-} > $W/gpu_tests.log 2>&1; echo "gpu_tests exit $?"
grep -E "^== |passed|failed|error" $W/gpu_tests.log | tail -60
find $W -name "*.lock" -delete; tar czf $OUT/callDH.tar.gz -C /tmp callDH
echo "t=$(( $(date +%s) - T0 ))"; date
