#!/bin/bash
# callGE (next session): the peeled split form after 53def58 (node 0's column of A and P as dots against a
# 16-row tile): tree-slots split vs split-peel at 33, 65, 128, 129 nodes (tiny / Weaver / SpecLA shapes, each
# checked against the fused output), then tree-phases' "peel" part (each phase alone, with and without the
# peel: where its overhead lies), then the peel GPU tests.
# carry: [".whl", "callGE.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGE; mkdir -p $W/logs; T0=$(date +%s)
pack() { tar czf $OUT/callGE.tar.gz -C /tmp callGE; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
TREE_SLOTS_VARIANTS=split-default,split-peel TREE_SLOTS_SIZES=33,65,128,129 TREE_SLOTS_SHAPES=tiny-qwen35,weaver,specla \
  TREE_SLOTS_BUDGET=150 timeout -s INT 200 python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "split-default|split-peel" $W/tree-slots.log; pack
TREE_PHASES_PARTS=peel TREE_PHASES_BUDGET=120 timeout -s INT 170 python3 scripts/gpu/tree-phases.py $W/tree-phases \
  > $W/tree-phases.log 2>&1; echo "tree-phases exit $? t=$(( $(date +%s) - T0 ))"; grep -E "T=" $W/tree-phases.log; pack
timeout -s INT -k 5 120 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_tree.py \
  -k "peel" > $W/logs/test_triton_tree.log 2>&1; echo "tests exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
