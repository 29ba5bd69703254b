#!/bin/bash
# callBQ: repro run routes with the verify form "auto" (GEMV groups up to 17 rows), then the GPU tests of
# the drafters' fast forwards (their 16-row linears now take the GEMV groups)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBQ; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBQ.tar.gz -C /tmp callBQ; }
date
echo "== routes auto"
timeout -s INT 105 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes-auto > $W/routes-auto.log 2>&1; echo "rc=$?" >> $W/routes-auto.log
grep -A 24 "^## Summary" $W/routes-auto/report.md | grep "| all"; tail -2 $W/routes-auto.log; pack; date
echo "== GPU tests"
printf '%s\n' tests/drafters/test_dflash_fast.py tests/drafters/test_eagle_fast.py > $W/files.txt
timeout 75 xargs -P 2 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 65 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider --junitxml='$W'/junit/$n.xml {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/files.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; date
