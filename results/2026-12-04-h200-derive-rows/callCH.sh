#!/bin/bash
# callCH: GPU tests (top-k kernels with the row argmax, every route through graphs equal to AR in float32,
# stepwise and pipelined); verify-kernels (the accept graph on the argmax kernels); routes A/B default,
# fused_tree, torch_argmax
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCH; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCH.tar.gz -C /tmp callCH; }
T0=$(date +%s); date
printf '%s\n' tests/models/test_topk_kernels.py tests/models/test_graphed.py tests/decoding/test_pipelined.py > $W/tests.txt
timeout 200 xargs -P 3 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== verify-kernels"
timeout -s INT 90 python3 scripts/gpu/verify-kernels.py $W/verify-kernels > $W/verify-kernels.log 2>&1; echo "rc=$?"
head -12 $W/verify-kernels/verify-kernels.md; grep -A16 "## accept + commit" $W/verify-kernels/verify-kernels.md; pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 578 - ($(date +%s) - T0) ))
echo "== routes-ab (left ${LEFT}s)"
ROUTES_AB_BUDGET_S=$(( LEFT - 15 )) ROUTES_AB_VARIANTS=default,fused_tree,torch_argmax timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -22 $W/routes-ab.log
pack; date
