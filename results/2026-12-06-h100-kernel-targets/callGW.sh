#!/bin/bash
# callGW: what phase 1 of the split tree kernel spends on the H100 (scripts/gpu/tree-phases.py "knobs": the keys
# kernel alone at 32- and 64-row blocks, with the diagonal inverse or the mask loads priced out), Weaver and
# SpecLA at T = 128, where GV (2026-12-06-h100-kernel-targets) found phase 1 20.8 / 13.1 us of 32.9 / 19.7.
# carry: [".whl", "callGW.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGW; mkdir -p $W
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
TREE_PHASES_PARTS=knobs TREE_PHASES_BLOCKS=knobs:weaver:128,knobs:specla:128 TREE_PHASES_BUDGET=${2:-100} \
  timeout -s INT -k 10 ${3:-170} python3 scripts/gpu/tree-phases.py $W/tree-phases > $W/tree-phases.log 2>&1
echo "tree-phases rc=$? t=$(( $(date +%s) - T0 ))"; grep -E "phase1:(default|no-inverse|no-mask-loads)" $W/tree-phases/tree-phases.md 2>/dev/null | head -20
tar czf $OUT/callGW.tar.gz -C /tmp callGW; echo "t=$(( $(date +%s) - T0 ))"
