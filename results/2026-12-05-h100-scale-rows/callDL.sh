#!/bin/bash
# callDL: W1-scale again after aba2c6d (the replayed draws out of the decode clock): `repro bench scale
# --shape qwen3.6-27b --acceptance paper-mal` with the routes and sizes of 2026-12-04-h200-weaver-tile/paper-mal.
# carry: [".whl", "callDL.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDL; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; lscpu | grep "Model name"
timeout -s INT -k 10 545 python3 -m repro bench scale --shape qwen3.6-27b --routes ar,dflash_chain,ddtree,dflash_tfm \
  --acceptance paper-mal --device cuda --dtype bfloat16 --prompts 16 --max-new-tokens 256 --out $W/paper-mal-27b \
  > $W/scale.log 2>&1; echo "rc=$?" >> $W/scale.log
tail -25 $W/scale.log
find $W -name "*.lock" -delete; tar czf $OUT/callDL.tar.gz -C /tmp callDL
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
