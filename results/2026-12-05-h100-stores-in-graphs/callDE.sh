#!/bin/bash
# callDE: graphed.HOST_WRITES's stores inside the step graphs (e8e3bbd, still off by default): GPU tests of the
# tagged stores and of pipelined routes with them (captures between a launch and its read), then routes A/B
# default (stream copies) / host_writes. carry: [".whl", "callDE.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDE; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDE.tar.gz -C /tmp callDE; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
timeout -s INT -k 5 70 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/models/test_slot_kernels.py > $W/logs/test_slot_kernels.log 2>&1; echo "tests exit $?"
timeout -s INT -k 5 170 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/decoding/test_pipelined.py -k "host_writes or captures_between" > $W/logs/test_pipelined.log 2>&1; echo "tests exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; grep -hE "^E  " $W/logs/*.log | head -10
echo "t=$(( $(date +%s) - T0 ))"
pack
LEFT=$(( 560 - ($(date +%s) - T0) ))
ROUTES_AB_BUDGET_S=$(( LEFT - 10 )) ROUTES_AB_VARIANTS=default,host_writes timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
