#!/bin/bash
# callGV: every kernel target of issues 13 and 10 judged in one `repro bench kernels` run (verify with each tree
# form's phase 1 timed alone, the delayed-commit steps, the path commits, the chains), both paper shapes.
# carry: [".whl", "callGV.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGV; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callGV.tar.gz -C /tmp callGV; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 ${2:-560} python3 -m repro bench kernels --out $W/bench-kernels --shapes specla,weaver \
  --methods tree_fused,tree_split,tree_split_peel,step_closed_form_fused,step_path_fused,step_delayed_fused,step_delayed_split_indexed,commit_path_indexed_conv,commit_path_indexed,chain_verify,chain_chunk \
  --warmup-ms 5 --rep-ms 20 --time-budget ${3:-500} > $W/bench-kernels.log 2>&1
echo "bench kernels rc=$? t=$(( $(date +%s) - T0 ))"; sed -n '/Kernel targets/,/^## specla/p' $W/bench-kernels/report.md | head -24
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
