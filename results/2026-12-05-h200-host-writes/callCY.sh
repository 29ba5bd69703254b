#!/bin/bash
# callCY: graphed.HOST_WRITES (a step's result stored into its pinned host buffer by a kernel, tagged, polled by
# the host; no stream copy, no event): routes A/B default / host_writes, then the GPU tests of the slot
# kernels (the stores on CUDA) and the pipelined routes (equal to AR in float32). carry: [".whl", "callCY.sh"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callCY; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCY.tar.gz -C /tmp callCY; }
T0=$(date +%s); date
ROUTES_AB_BUDGET_S=200 ROUTES_AB_VARIANTS=default,host_writes timeout -s INT 220 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -16; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 330 - ($(date +%s) - T0) ))
printf '%s\n' tests/models/test_slot_kernels.py tests/decoding/test_pipelined.py | timeout $LEFT xargs -P 2 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 '$LEFT' python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"'
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; cat $W/results.txt; grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"; date
