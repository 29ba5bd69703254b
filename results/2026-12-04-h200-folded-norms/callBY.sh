#!/bin/bash
# callBY: the GPU tests touched by this session's folded rows, on the final kernel: the fused verify (three
# variants), every route through graphs equal to AR in float32 (stepwise, pipelined), the drafters' fast paths
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBY; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBY.tar.gz -C /tmp callBY; }
date
printf '%s\n' tests/models/test_fused_verify.py tests/models/test_graphed.py tests/decoding/test_pipelined.py tests/drafters/test_eagle_fast.py tests/drafters/test_dflash_fast.py > $W/tests.txt
timeout 140 xargs -P 5 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 130 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; date
