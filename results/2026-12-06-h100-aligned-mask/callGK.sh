#!/bin/bash
# callGK (next session): the tree kernels at HEAD (6b0209a's gate_columns: the strict-ancestor load at n = 2^k + 1;
# peels_root 17-65): their GPU tests, tree-slots split vs split-peel at 17 / 33 / 65 / 129 (3 shapes), repro bench
# kernels (verify, specla + weaver, 33 / 65 / 129: split vs split_peel vs fused), routes A/B default vs peel_root.
# carry: [".whl", "callGK.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-570}
source scripts/gpu_env.sh
W=/tmp/callGK; mkdir -p $W/logs
pack() { tar czf $OUT/callGK.tar.gz -C /tmp callGK; }
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
timeout -s INT -k 5 $(cap 150) python3 -m pytest -m gpu -n 0 -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  > $W/logs/test_triton_tree.log 2>&1; echo "tests exit $? t=$(( $(date +%s) - T0 ))"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; grep -c PASSED $W/results.txt
grep -E "^(FAILED|ERROR)" $W/results.txt | head; pack
TREE_SLOTS_VARIANTS=fused,split-default,split-peel TREE_SLOTS_SIZES=17,33,65,129 TREE_SLOTS_SHAPES=tiny-qwen35,weaver,specla \
  TREE_SLOTS_BUDGET=100 timeout -s INT $(cap 140) python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "^\| " $W/tree-slots.log; pack
timeout -s INT $(cap 90) python3 -m repro bench kernels --out $W/bench-kernels-slots --groups verify --shapes specla,weaver \
  --sizes 33,65,129 --methods tree_fused,tree_split,tree_split_peel --warmup-ms 2 --rep-ms 8 > $W/bench-kernels.log 2>&1
echo "bench kernels exit $? t=$(( $(date +%s) - T0 ))"; pack
L=$(cap 200); if [ "$L" -gt 90 ]; then
  ROUTES_AB_BUDGET_S=$(( L - 20 )) ROUTES_AB_VARIANTS=default,peel_root,default_again timeout -s INT $L \
    python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
  grep -v "^{" $W/routes-ab.log | tail -16
fi
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
