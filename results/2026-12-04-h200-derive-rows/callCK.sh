#!/bin/bash
# callCK: GPU tests (slot kernels with the tree copy kernel, every route through graphs equal to AR in float32
# stepwise and pipelined, the best-first graphs); repro run routes at the session's defaults; step-gaps
# (DDTree, chain DFlash); routes A/B default vs stream_copies with what time is left
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCK; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCK.tar.gz -C /tmp callCK; }
T0=$(date +%s); date
printf '%s\n' tests/models/test_slot_kernels.py tests/models/test_graphed.py tests/decoding/test_pipelined.py tests/decoding/test_best_first_kernel.py > $W/tests.txt
timeout 200 xargs -P 4 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== repro run routes"
timeout -s INT 220 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -6; tail -2 $W/routes.log; pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== step-gaps"
STEP_GAPS_ROUTES=ddtree-b32,dflash-chain STEP_GAPS_VARIANTS=default timeout -s INT 80 python3 scripts/gpu/step-gaps.py $W/step-gaps > $W/step-gaps.log 2>&1; echo "rc=$?"
tail -6 $W/step-gaps.log; pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 570 - ($(date +%s) - T0) ))
echo "== routes-ab (left ${LEFT}s)"
if [ $LEFT -gt 120 ]; then
ROUTES_AB_BUDGET_S=$(( LEFT - 10 )) ROUTES_AB_VARIANTS=default,stream_copies timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -16 $W/routes-ab.log
fi
pack; date
