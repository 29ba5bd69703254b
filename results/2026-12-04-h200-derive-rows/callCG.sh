#!/bin/bash
# callCG: GPU tests of the slot kernels (derive one row a program), the DFlash fast drafter (folded by
# default), the stage clock; slot-bench (greedy_node grid); verify-kernels (with the accept graph);
# routes A/B default vs clock_every4 (StageClock's events on every 4th step)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCG; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCG.tar.gz -C /tmp callCG; }
T0=$(date +%s); date
printf '%s\n' tests/models/test_slot_kernels.py tests/drafters/test_dflash_fast.py tests/decoding/test_stage_clock.py > $W/tests.txt
timeout 170 xargs -P 3 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 160 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== slot-bench"
timeout -s INT 80 python3 scripts/gpu/slot-bench.py $W/slot-bench > $W/slot-bench.log 2>&1; echo "rc=$?"
tail -20 $W/slot-bench.log; pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== verify-kernels"
timeout -s INT 90 python3 scripts/gpu/verify-kernels.py $W/verify-kernels > $W/verify-kernels.log 2>&1; echo "rc=$?"
head -12 $W/verify-kernels/verify-kernels.md; grep -A16 "## accept + commit" $W/verify-kernels/verify-kernels.md; pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 578 - ($(date +%s) - T0) ))
echo "== routes-ab (left ${LEFT}s)"
ROUTES_AB_BUDGET_S=$(( LEFT - 15 )) ROUTES_AB_VARIANTS=default,clock_every4 timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -16 $W/routes-ab.log
pack; date
