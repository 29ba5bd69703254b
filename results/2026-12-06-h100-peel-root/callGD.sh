#!/bin/bash
# callGD: callGC again after c12f46f (split_peel's scratch aligned: nodes 1.. from row 0, node 0's columns in a buffer of
# their own): the peel GPU tests, tree-slots (fused / split / split-peel at 32, 33, 64, 65, 128, 129 nodes), routes
# A/B default vs peel_root, as far as LIMIT seconds ($2) allow.
# carry: [".whl", "callGD.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-570}
source scripts/gpu_env.sh
W=/tmp/callGD; mkdir -p $W/logs
pack() { tar czf $OUT/callGD.tar.gz -C /tmp callGD; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
timeout -s INT -k 5 $(cap 110) python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  -k "peel" > $W/logs/test_triton_tree.log 2>&1
echo "tests exit $?"; grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10; pack; echo "t=$(( $(date +%s) - T0 ))"
TREE_SLOTS_VARIANTS=fused,split-default,split-peel TREE_SLOTS_SIZES=32,33,64,65,128,129 TREE_SLOTS_SHAPES=tiny-qwen35,weaver,specla TREE_SLOTS_BUDGET=$(( $(cap 150) - 25 )) timeout -s INT $(cap 150) python3 scripts/gpu/tree-slots.py $W/tree-slots \
  > $W/tree-slots.log 2>&1; echo "tree-slots exit $?"
grep -E "split-default|split-peel|fused" $W/tree-slots.log | head -60; pack; echo "t=$(( $(date +%s) - T0 ))"
L=$(cap 260); if [ "$L" -gt 90 ]; then
  ROUTES_AB_BUDGET_S=$(( L - 20 )) ROUTES_AB_VARIANTS=default,peel_root timeout -s INT $L \
    python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
  grep -v "^{" $W/routes-ab.log | tail -16
fi
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
