#!/bin/bash
# callGT (next session): every GPU test file at one commit through scripts/gpu_tests.sh's deadline and summary
# (7 side by side, heaviest first), packed into one archive (a call returns at most 8 files).
# carry: [".whl", "callGT.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGT; mkdir -p $W
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $W/gpu.txt
mapfile -t FILES < <(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | sort)
OUT=$W GPU_TEST_JOBS=7 GPU_TEST_DEADLINE=${2:-540} bash scripts/gpu_tests.sh "${FILES[@]}" > $W/run.log 2>&1
echo "gpu_tests rc=$? t=$(( $(date +%s) - T0 ))" | tee -a $W/run.log; cat $W/summary.txt
for f in $W/log-*.txt; do [ $(stat -c %s $f) -gt 4096 ] && xz -9 $f; done
tar czf $OUT/callGT.tar.gz -C /tmp callGT; echo "t=$(( $(date +%s) - T0 ))"
