#!/bin/bash
# callDN: S1-scale again (callDM's cut at prompt 14 of 16 by its 200 s limit), then the 27B bf16 growth test
# at its bound 24 (8cc03c3; 2026-12-05-h100-sampled-draws' suite cut it while compiling).
# carry: [".whl", "callDN.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDN; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDN.tar.gz -C /tmp callDN; }
timeout -s INT -k 10 300 python3 -m repro bench scale --shape gdn-1.3b --acceptance paper-mal --prompts 16 \
  --max-new-tokens 256 --device cuda --dtype bfloat16 --out $W/paper-mal-1.3b > $W/paper-mal-1.3b.log 2>&1
echo "rc=$?" >> $W/paper-mal-1.3b.log
grep -E "^\| gdn" $W/paper-mal-1.3b.log | cut -c1-220; tail -2 $W/paper-mal-1.3b.log; pack
L=$(( 560 - ($(date +%s) - T0) )); echo "== growth test (limit $L s)"
timeout -k 10 $L python3 -m pytest -q -p no:warnings -m gpu tests/drafters/test_weaver_growth_fused.py \
  -k "test_programs_with_grid_barriers_equal_one_program and qwen3.6-27b" --junitxml=$W/growth.xml > $W/growth.log 2>&1
echo "rc=$?" >> $W/growth.log; tail -5 $W/growth.log; pack
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
