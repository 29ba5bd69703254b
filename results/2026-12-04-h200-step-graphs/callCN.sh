#!/bin/bash
# callCN: GPU tests (step chains; pipelined and graphed routes equal to AR in float32 with chains on);
# routes A/B default (chains) / no_chain / fuse_accept; repro run routes with what time is left
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCN; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCN.tar.gz -C /tmp callCN; }
T0=$(date +%s); date
printf '%s\n' tests/models/test_step_graph.py tests/decoding/test_pipelined.py tests/models/test_graphed.py > $W/tests.txt
timeout 200 xargs -P 3 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== routes-ab default,no_chain,fuse_accept"
ROUTES_AB_BUDGET_S=260 ROUTES_AB_VARIANTS=default,no_chain,fuse_accept timeout -s INT 270 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
grep -v "^{" $W/routes-ab.log | tail -22; grep -E "Error|error" $W/routes-ab.log | head -5; pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 580 - ($(date +%s) - T0) ))
echo "== repro run routes (left ${LEFT}s)"
if [ $LEFT -gt 60 ]; then
timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -8; tail -2 $W/routes.log
fi
pack; date
