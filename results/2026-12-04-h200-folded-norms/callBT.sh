#!/bin/bash
# callBT: scripts/gpu/routes-ab.py (one process: default = folded normed rows, scaled_rows, auto_rows), then
# repro run routes (bf16, graphed) at the default
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBT; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBT.tar.gz -C /tmp callBT; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== routes A/B"
ROUTES_AB_VARIANTS=default,scaled_rows,auto_rows timeout -s INT 230 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "rc=$?" >> $W/routes-ab.log
grep -A 40 "^| variant" $W/routes-ab.log | head -60; tail -4 $W/routes-ab.log
pack; date
echo "== repro run routes"
timeout -s INT 200 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep -A 24 "^## Summary" $W/routes/report.md | grep "| all"; tail -2 $W/routes.log; pack; date
