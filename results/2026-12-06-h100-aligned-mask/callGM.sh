#!/bin/bash
# callGM: the 129-node slots' aligned mask in the engine: the float32 GPU test of budget-128 trees (DDTree, SpecLA,
# DFlash-TfM through graphs == AR), then routes A/B at budget 128, default vs unaligned_mask.
# carry: [".whl", "callGM.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-430}
source scripts/gpu_env.sh
W=/tmp/callGM; mkdir -p $W/logs
pack() { tar czf $OUT/callGM.tar.gz -C /tmp callGM; }
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
timeout -s INT -k 5 $(cap 130) python3 -m pytest -m gpu -n 0 -rA -p no:cacheprovider tests/models/test_graphed.py \
  -k "trees_of_128" > $W/logs/test_graphed.log 2>&1; echo "tests exit $? t=$(( $(date +%s) - T0 ))"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; pack
L=$(cap 300); if [ "$L" -gt 90 ]; then
  ROUTES_AB_TREE_BUDGET=128 ROUTES_AB_BUDGET_S=$(( L - 10 )) ROUTES_AB_VARIANTS=default,unaligned_mask \
    timeout -s INT $L python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
  grep -v "^{" $W/routes-ab.log | tail -14
fi
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
