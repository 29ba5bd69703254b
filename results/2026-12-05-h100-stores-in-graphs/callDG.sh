#!/bin/bash
# callDG: engine.PAUSE_GC (the collector paused inside timed generations): `repro run routes` through
# scripts/gpu/gc-probe.py with the collector on / off / on / off (alternating processes: process noise too),
# then routes A/B default / gc_on. carry: [".whl", "callDG.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDG; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDG.tar.gz -C /tmp callDG; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
for i in 1 2; do
  for mode in on off; do
    timeout -s INT 110 python3 scripts/gpu/gc-probe.py $W/p$i $mode > $W/logs/gc-$mode-$i.log 2>&1; echo "gc-probe $mode $i exit $?"
    grep '"inside"' $W/logs/gc-$mode-$i.log | tr '\n' ' '; echo
    grep "| all (pooled)\|| all  *| ar " $W/p$i/routes-gc-$mode/report.md | head -6
    echo "t=$(( $(date +%s) - T0 ))"
  done
  pack
done
ROUTES_AB_BUDGET_S=110 ROUTES_AB_VARIANTS=default,gc_on timeout -s INT 120 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"; date
