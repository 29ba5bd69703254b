#!/bin/bash
# callGR: `repro bench model` at HEAD (issue 13's decode rows: AR at the GDN-1.3B / Qwen3.6-27B shapes against the
# weight-bandwidth floor, verify(64) / decode), as callAW ran it on the H200 on 2026-12-04.
# carry: [".whl", "callGR.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGR; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callGR.tar.gz -C /tmp callGR; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 ${2:-420} python3 -m repro bench model --shapes gdn-1.3b,qwen3.6-27b --no-compile \
  --time-budget 150 --out $W/bench-model > $W/bench-model.log 2>&1
echo "bench model rc=$? t=$(( $(date +%s) - T0 ))"; tail -30 $W/bench-model.log; pack
