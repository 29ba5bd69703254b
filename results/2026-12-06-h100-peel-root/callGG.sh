#!/bin/bash
# callGG: where the peeled split form's phase 1 loses at 64-row blocks (after 651ae17: 76-82 us at Weaver's 128 /
# 129 nodes against 20 unpeeled): tree-phases' peel part (peeled on 32-row blocks too, phase 1 without its node-0
# programs, the compiled variants' registers / spills / shared memory), then repro bench kernels' 33 / 65 rows
# (split vs split-peel, SpecLA and Weaver shapes).
# carry: [".whl", "callGG.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGG; mkdir -p $W
pack() { tar czf $OUT/callGG.tar.gz -C /tmp callGG; }
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
TREE_PHASES_PARTS=peel TREE_PHASES_BLOCKS=peel:weaver:129,peel:tiny-qwen35:129,peel:weaver:128,peel:weaver:65 \
  TREE_PHASES_BUDGET=150 timeout -s INT 200 python3 scripts/gpu/tree-phases.py $W/tree-phases > $W/tree-phases.log 2>&1
echo "tree-phases exit $? t=$(( $(date +%s) - T0 ))"; grep -E "T=|kernel" $W/tree-phases.log; pack
timeout -s INT 120 python3 -m repro bench kernels --out $W/bench-kernels-peel --groups verify --shapes specla,weaver \
  --sizes 33,65 --methods tree_split,tree_split_peel --warmup-ms 2 --rep-ms 8 > $W/bench-kernels.log 2>&1
echo "bench kernels exit $? t=$(( $(date +%s) - T0 ))"; tail -12 $W/bench-kernels.log; pack
save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
