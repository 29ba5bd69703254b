#!/bin/bash
# callDA: graphed.HOST_WRITES on (the tagged kernel with no specialisation): the slot kernels' GPU tests (one
# binary for every tag / length / offset), routes A/B default / stream_copies, then `repro run routes` at the
# defaults. carry: [".whl", "callDA.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDA; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDA.tar.gz -C /tmp callDA; }
T0=$(date +%s); date
timeout -s INT -k 5 70 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/models/test_slot_kernels.py > $W/logs/test_slot_kernels.log 2>&1; echo "tests exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; grep -hE "^E  " $W/logs/*.log | head -10
echo "t=$(( $(date +%s) - T0 ))"
ROUTES_AB_BUDGET_S=290 ROUTES_AB_VARIANTS=default,stream_copies timeout -s INT 300 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 565 - ($(date +%s) - T0) ))
timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -8; tail -2 $W/routes.log
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
