#!/bin/bash
# callCC: top-k tiles (topk-bench: chunk x warps per shape); routes A/B in one process: default (4096-entry
# chunks), torch_topk, topk_chunk1024; the top-k GPU tests
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCC; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCC.tar.gz -C /tmp callCC; }
date
timeout -s INT 90 python3 scripts/gpu/topk-bench.py $W/topk-bench > $W/topk-bench.log 2>&1; echo "topk-bench exit $?"; tail -18 $W/topk-bench.log
pack
ROUTES_AB_BUDGET_S=330 ROUTES_AB_VARIANTS=default,torch_topk,topk_chunk1024 timeout -s INT 440 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -22 $W/routes-ab.log
pack; date
timeout -s INT -k 5 60 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_topk.py > $W/logs/test_triton_topk.log 2>&1; echo "test_triton_topk exit $?"
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -10
pack; date
