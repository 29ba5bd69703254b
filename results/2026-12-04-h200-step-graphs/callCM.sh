#!/bin/bash
# callCM: GPU tests (pipelined incl. the fused verify+acceptance graph, graphed, static decoder with the fused
# tree kernel at 17 nodes); routes A/B default vs fuse_accept; budget sweep of DDTree (bf16, graphed)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCM; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCM.tar.gz -C /tmp callCM; }
T0=$(date +%s); date
printf '%s\n' tests/decoding/test_pipelined.py tests/models/test_graphed.py tests/models/test_static_decoder.py tests/models/test_fused_verify.py > $W/tests.txt
timeout 200 xargs -P 4 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== routes-ab default,fuse_accept"
ROUTES_AB_BUDGET_S=200 ROUTES_AB_VARIANTS=default,fuse_accept timeout -s INT 215 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -16 $W/routes-ab.log; pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "== sweep (left ${LEFT}s)"
timeout -s INT $LEFT python3 -m repro sweep --device cuda --dtype bfloat16 --budget 16,32,64 --routes ddtree --limit 4 --max-new-tokens 128 --out $W/sweep > $W/sweep.log 2>&1; echo "sweep rc=$?"
tail -30 $W/sweep.log; cat $W/sweep/report.md 2>/dev/null | head -40
pack; date
