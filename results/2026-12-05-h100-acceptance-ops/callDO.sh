#!/bin/bash
# callDO: `repro run table2` (bf16, graphed, defaults) at HEAD: the keyed uniforms hashed in one chain
# (spec_sampling's acceptance 603 -> 187 torch ops a step, traversal's 697 -> 281) timed against callDK.
# carry: [".whl", "callDO.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDO; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT -k 10 420 python3 -m repro run table2 --device cuda --dtype bfloat16 --engine graphed \
  --out $W/table2-bf16-graphed > $W/table2.log 2>&1; echo "rc=$?" >> $W/table2.log
tail -2 $W/table2.log; grep -E "^\| all " $W/table2-bf16-graphed/report.md | head -12
find $W -name "*.lock" -delete; tar czf $OUT/callDO.tar.gz -C /tmp callDO
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
