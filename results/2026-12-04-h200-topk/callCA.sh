#!/bin/bash
# callCA: the row top-k kernels (repro/gdn/triton_topk.py): routes A/B in one process (default vs torch_topk),
# then the GPU tests of the top-k, best-first, both static drafters, graphed and pipelined routes
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCA; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCA.tar.gz -C /tmp callCA; }
date
ROUTES_AB_VARIANTS=default,torch_topk timeout -s INT 260 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -40 $W/routes-ab.log
pack; date
printf '%s\n' tests/gdn/test_triton_topk.py tests/decoding/test_best_first_kernel.py tests/drafters/test_eagle_static.py tests/drafters/test_dflash_static.py tests/models/test_graphed.py > $W/tests.txt
timeout 200 xargs -P 5 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 190 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; date
