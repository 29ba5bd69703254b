#!/bin/bash
# callCR (warm, after CQ): routes A/B default / gated_out_proj / fuse_tree (same process, same tokens), then
# `repro run routes` at the defaults with the time left. carry: [".whl", "callCR.sh", ".triton-cache.tgz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callCR; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCR.tar.gz -C /tmp callCR; }
T0=$(date +%s); date
ROUTES_AB_BUDGET_S=280 ROUTES_AB_VARIANTS=default,gated_out_proj,fuse_tree timeout -s INT 300 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -26; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 560 - ($(date +%s) - T0) ))
if [ $LEFT -gt 150 ]; then
  timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
  grep "| all" $W/routes/report.md | head -8; tail -2 $W/routes.log
fi
pack; save_triton_cache $OUT; date
