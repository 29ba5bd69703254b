#!/bin/bash
# callGS: issue 13's chain and commit targets at HEAD beside GP's verify rows (`repro bench kernels --groups
# chain,recovery`, both paper shapes, the target rows and their baselines only; the report judges the targets).
# carry: [".whl", "callGS.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGS; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callGS.tar.gz -C /tmp callGS; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 ${2:-180} python3 -m repro bench kernels --out $W/bench-kernels --groups chain,recovery \
  --shapes specla,weaver --methods chain_verify,chain_chunk,commit_path_indexed_conv,commit_path_indexed \
  --time-budget ${3:-150} > $W/bench-kernels.log 2>&1
echo "bench kernels rc=$? t=$(( $(date +%s) - T0 ))"; grep -A16 "kernel targets" $W/bench-kernels/report.md; pack
