#!/bin/bash
# callGN: tree-slots at 33 / 64 / 256 nodes with every variant, the fused kernel over 32-row blocks too (fused-br32: its
# 64-row blocks spill at Weaver's shape, ptxas on the CPU), the split form's walks at 256 (the registers walk spills
# there): which form and tiles the engine should take at Weaver's <= 64 nodes and at 256.
# carry: [".whl", "callGN.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-330}
source scripts/gpu_env.sh
W=/tmp/callGN; mkdir -p $W
pack() { tar czf $OUT/callGN.tar.gz -C /tmp callGN; }
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
TREE_SLOTS_SIZES=33,64,256 TREE_SLOTS_SHAPES=weaver,tiny-qwen35,specla TREE_SLOTS_BUDGET=$(( $(left) - 40 )) \
  timeout -s INT $(left) python3 scripts/gpu/tree-slots.py $W/tree-slots > $W/tree-slots.log 2>&1
echo "tree-slots exit $? t=$(( $(date +%s) - T0 ))"; grep -E "^\| " $W/tree-slots.log; pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
