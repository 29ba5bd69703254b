#!/bin/bash
# callGL: the GDN tree kernels reading an aligned copy of the ancestor mask above 64 nodes (triton_tree.mask_rows:
# ptxas on the CPU gave 129-node phase 1 229-255 registers with spills -> 153-212 without): tree-slots at 65 / 129
# (3 shapes; compare callGK), routes A/B at budget 128 default vs unaligned_mask, repro bench kernels at 129,
# the tree GPU tests (split / peel / mask) with what time is left.
# carry: [".whl", "callGL.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-570}
source scripts/gpu_env.sh
W=/tmp/callGL; mkdir -p $W/logs
pack() { tar czf $OUT/callGL.tar.gz -C /tmp callGL; }
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
TREE_SLOTS_VARIANTS=fused,split-default,split-peel TREE_SLOTS_SIZES=65,129 TREE_SLOTS_SHAPES=weaver,specla,tiny-qwen35 \
  TREE_SLOTS_BUDGET=110 timeout -s INT $(cap 140) python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "^\| " $W/tree-slots.log; pack
L=$(cap 210); if [ "$L" -gt 90 ]; then
  ROUTES_AB_TREE_BUDGET=128 ROUTES_AB_BUDGET_S=$(( L - 20 )) ROUTES_AB_VARIANTS=default,unaligned_mask,default_again \
    timeout -s INT $L python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
  grep -v "^{" $W/routes-ab.log | tail -18
fi
pack
timeout -s INT $(cap 80) python3 -m repro bench kernels --out $W/bench-kernels-129 --groups verify --shapes specla,weaver \
  --sizes 129 --methods per_branch_recurrent,tree_split,tree_split_peel --warmup-ms 2 --rep-ms 8 > $W/bench-kernels.log 2>&1
echo "bench kernels exit $? t=$(( $(date +%s) - T0 ))"; pack
timeout -s INT -k 5 $(cap 150) python3 -m pytest -m gpu -n 0 -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  -k "split or peel" > $W/logs/test_triton_tree.log 2>&1; echo "tests exit $? t=$(( $(date +%s) - T0 ))"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; grep -c PASSED $W/results.txt
grep -E "^(FAILED|ERROR)" $W/results.txt | head; pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
