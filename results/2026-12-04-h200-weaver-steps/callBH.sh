#!/bin/bash
# callBH: Weaver steps of w nodes (the paper's w): GPU tests of the growth and of every route on the graphed
# engine, growth-widths (tiny and 27B shapes, w = 1, 2, 4, 8), repro run routes (bf16, graphed)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBH; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBH.tar.gz -C /tmp callBH; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
printf '%s\n' tests/drafters/test_weaver_growth.py tests/drafters/test_weaver_growth_fused.py tests/decoding/test_pipelined.py tests/models/test_graphed.py tests/decoding/test_stage_clock.py > $W/files.txt
timeout 200 xargs -P 5 -I{} bash -c 'n=$(basename {} .py); OUT='$W'/junit GPU_TEST_TIMEOUT=190 bash scripts/gpu_tests.sh {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/files.txt | tee $W/summary.txt
for f in $W/logs/*.log; do echo "$(basename $f .log): $(grep -E '[0-9]+ (passed|failed|error)' $f | tail -1)"; done | tee $W/results.txt
pack; date
echo "== growth-widths"
timeout 110 python3 scripts/gpu/growth-widths.py $W/growth-widths > $W/growth-widths.log 2>&1; echo "rc=$?" >> $W/growth-widths.log
tail -22 $W/growth-widths.log; pack; date
echo "== repro run routes"
timeout 170 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep -A 24 "^## Summary" $W/routes/report.md | grep "| all"; tail -2 $W/routes.log; pack; date
