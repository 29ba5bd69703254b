#!/bin/bash
# callBX: the final folded rows (sum of squares in a second pass; 33-64-row normed entries retuned): the GPU
# tests of the row-tiled kernels, scripts/gpu/routes-ab.py (default = folded, scaled_rows), repro run routes
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBX; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBX.tar.gz -C /tmp callBX; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== GPU tests"
timeout -s INT 100 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_linear_rows.py > $W/tests.log 2>&1; echo "rc=$?" >> $W/tests.log
grep -hE "^(PASSED|FAILED|ERROR)|^E  |rc=" $W/tests.log | head -20
pack; date
echo "== routes A/B"
ROUTES_AB_VARIANTS=default,scaled_rows timeout -s INT 170 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "rc=$?" >> $W/routes-ab.log
tail -14 $W/routes-ab.log
pack; date
echo "== repro run routes"
timeout -s INT 170 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -6; tail -2 $W/routes.log; pack; date
