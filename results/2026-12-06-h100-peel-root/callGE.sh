#!/bin/bash
# callGE: tree-slots after 53def58 (node 0's column of A and P as dots against a 16-row tile): split vs
# split-peel at 33, 65, 128, 129 nodes, tiny / Weaver / SpecLA shapes, each checked against the fused output.
# carry: [".whl", "callGE.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGE; mkdir -p $W; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
TREE_SLOTS_VARIANTS=split-default,split-peel TREE_SLOTS_SIZES=33,65,128,129 TREE_SLOTS_SHAPES=tiny-qwen35,weaver,specla \
  TREE_SLOTS_BUDGET=${2:-90} timeout -s INT $(( ${2:-90} + 25 )) python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "split-default|split-peel" $W/tree-slots.log
tar czf $OUT/callGE.tar.gz -C /tmp callGE
