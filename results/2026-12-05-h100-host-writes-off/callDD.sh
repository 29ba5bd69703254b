#!/bin/bash
# callDD: graphed.HOST_WRITES off again (stream copies): routes A/B default / host_writes, then `repro run routes` at the
# defaults. carry: [".whl", "callDD.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDD; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDD.tar.gz -C /tmp callDD; }
T0=$(date +%s); date
echo "t=$(( $(date +%s) - T0 ))"
ROUTES_AB_BUDGET_S=290 ROUTES_AB_VARIANTS=default,host_writes timeout -s INT 300 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 565 - ($(date +%s) - T0) ))
timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -14; tail -2 $W/routes.log
pack; echo "t=$(( $(date +%s) - T0 ))"; date
