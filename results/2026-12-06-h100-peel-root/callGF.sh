#!/bin/bash
# callGF: the peel after 651ae17 (node 0's column in programs of their own; the gates' load over the other n - 1
# columns): peel GPU tests, tree-slots split vs split-peel at 33 / 65 / 128 / 129 nodes (3 shapes), tree-phases'
# peel part, repro bench kernels (verify, specla + weaver, 33 / 65 / 129, tree_split vs tree_split_peel), then
# routes A/B default vs peel_root as far as LIMIT ($2) allows.
# carry: [".whl", "callGF.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-570}
source scripts/gpu_env.sh
W=/tmp/callGF; mkdir -p $W/logs
pack() { tar czf $OUT/callGF.tar.gz -C /tmp callGF; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
timeout -s INT -k 5 $(cap 110) python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  -k "peel" > $W/logs/test_triton_tree.log 2>&1
echo "tests exit $?"; grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10; pack; echo "t=$(( $(date +%s) - T0 ))"
TREE_SLOTS_VARIANTS=split-default,split-peel TREE_SLOTS_SIZES=33,65,128,129 TREE_SLOTS_SHAPES=tiny-qwen35,weaver,specla \
  TREE_SLOTS_BUDGET=120 timeout -s INT $(cap 160) python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "^\| " $W/tree-slots.log; pack
TREE_PHASES_PARTS=peel TREE_PHASES_BUDGET=80 timeout -s INT $(cap 120) python3 scripts/gpu/tree-phases.py $W/tree-phases \
  > $W/tree-phases.log 2>&1; echo "tree-phases exit $? t=$(( $(date +%s) - T0 ))"; grep -E "T=" $W/tree-phases.log; pack
timeout -s INT $(cap 90) repro bench kernels --out $W/bench-kernels-peel --groups verify --shapes specla,weaver \
  --sizes 33,65,129 --methods tree_split,tree_split_peel --warmup-ms 2 --rep-ms 8 > $W/bench-kernels.log 2>&1
echo "bench kernels exit $? t=$(( $(date +%s) - T0 ))"; tail -20 $W/bench-kernels-peel/report.md; pack
L=$(cap 200); if [ "$L" -gt 90 ]; then
  ROUTES_AB_BUDGET_S=$(( L - 20 )) ROUTES_AB_VARIANTS=default,peel_root timeout -s INT $L \
    python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
  grep -v "^{" $W/routes-ab.log | tail -16
fi
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
