#!/bin/bash
# callGO: the GPU tests of the fused and blocked tree kernels (their mask now read at its row stride), with what
# device time is left.
# carry: [".whl", "callGO.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-200}
source scripts/gpu_env.sh
W=/tmp/callGO; mkdir -p $W/logs
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 5 $(( LIMIT - 15 )) python3 -m pytest -m gpu -n 0 -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  -k "gpu_tree and not split" > $W/logs/test_triton_tree.log 2>&1; echo "tests exit $? t=$(( $(date +%s) - T0 ))"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; grep -c PASSED $W/results.txt
grep -E "^(FAILED|ERROR)" $W/results.txt | head; tail -3 $W/logs/test_triton_tree.log; tar czf $OUT/callGO.tar.gz -C /tmp callGO
