#!/bin/bash
# callDF: graphed.HOST_WRITES on by default (stores inside the step graphs): GPU tests of pipelined routes (both settings),
# routes A/B default / stream_copies, then `repro run routes` at the defaults.
# carry: [".whl", "callDF.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDF; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDF.tar.gz -C /tmp callDF; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
timeout -s INT -k 5 200 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/decoding/test_pipelined.py -k "equal_ar_in_float32_on_cuda_graphs or captures_between" > $W/logs/test_pipelined.log 2>&1; echo "tests exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; grep -hE "^E  " $W/logs/*.log | head -10
echo "t=$(( $(date +%s) - T0 ))"
pack
ROUTES_AB_BUDGET_S=110 ROUTES_AB_VARIANTS=default,stream_copies timeout -s INT 120 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 570 - ($(date +%s) - T0) ))
timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -14; tail -2 $W/routes.log
pack; echo "t=$(( $(date +%s) - T0 ))"; date
