#!/bin/bash
# callCD: repro run routes on the top-k kernels (1024-entry chunks); the GPU tests of the top-k, best-first,
# graphed and pipelined routes and the static EAGLE drafter; topk-bench (three tiles)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCD; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCD.tar.gz -C /tmp callCD; }
date
echo "== repro run routes"
timeout -s INT 200 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -6; tail -2 $W/routes.log; pack; date
printf '%s\n' tests/gdn/test_triton_topk.py tests/decoding/test_best_first_kernel.py tests/drafters/test_eagle_static.py tests/decoding/test_pipelined.py tests/models/test_graphed.py > $W/tests.txt
timeout 200 xargs -P 5 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; date
timeout -s INT 100 python3 scripts/gpu/topk-bench.py $W/topk-bench > $W/topk-bench.log 2>&1; echo "topk-bench exit $?"; tail -16 $W/topk-bench.log
pack; date
