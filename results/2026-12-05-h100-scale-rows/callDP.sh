#!/bin/bash
# callDP: the peak GPU memory a scale run records: the tiny-shape GPU test, then a short run at both papers'
# shapes (2 prompts x 64 tokens: how much of an 80 GB card the 27B target and its drafters take).
# carry: [".whl", "callDP.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDP; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDP.tar.gz -C /tmp callDP; }
timeout -k 10 100 python3 -m pytest -q -p no:warnings -p no:xdist -m gpu tests/bench/test_scale.py -k test_tiny_shape_on_cuda_graphs \
  > $W/test.log 2>&1; echo "rc=$?" >> $W/test.log; tail -3 $W/test.log
L=$(( 320 - ($(date +%s) - T0) ))
timeout -s INT -k 10 $L python3 -m repro bench scale --shape qwen3.6-27b,gdn-1.3b --acceptance paper-mal \
  --device cuda --dtype bfloat16 --prompts 2 --max-new-tokens 64 --out $W/memory > $W/memory.log 2>&1
echo "rc=$?" >> $W/memory.log; tail -2 $W/memory.log; grep "Peak GPU" $W/memory/report.md
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
