#!/bin/bash
# callCU: callCT again after the fix (the fused slots keep the captured layers' outputs in buffers of their own)
# draft's end marked inside it): the GPU tests of the files it touches; graph boundaries and in-graph event
# nodes on small kernels; routes A/B default / no_step_graph / no_step_marks / no_clock_events.
# carry: [".whl", "callCU.sh"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callCU; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCU.tar.gz -C /tmp callCU; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
printf '%s\n' tests/decoding/test_pipelined.py tests/decoding/test_stage_clock.py tests/models/test_graphed.py \
  tests/decoding/test_tree_builders_device.py > $W/tests.txt
timeout 300 xargs -P 4 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 280 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; grep -v ^PASSED $W/results.txt
echo "passed: $(grep -c ^PASSED $W/results.txt)"; grep -hE "^E  " $W/logs/*.log | head -20
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 570 - ($(date +%s) - T0) ))
ROUTES_AB_BUDGET_S=$(( LEFT - 20 )) ROUTES_AB_VARIANTS=default,no_step_graph,no_step_marks,no_clock_events timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -28; grep -E "Error|error" $W/routes-ab.log | head -5
pack; echo "t=$(( $(date +%s) - T0 ))"; date
