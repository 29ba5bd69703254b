#!/bin/bash
# callBJ: GPU tests of Weaver's growth (torch twin, fused kernel at widths 1 and 4, grid barriers at the tiny
# and 27B shapes), growth-widths (w = 1, 2, 4, 8; 8 and 16 warps), growth-stages (width 1, by stage)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBJ; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBJ.tar.gz -C /tmp callBJ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
printf '%s\n' tests/drafters/test_weaver_growth.py tests/drafters/test_weaver_growth_fused.py > $W/files.txt
timeout 295 xargs -P 2 -I{} bash -c 'n=$(basename {} .py); OUT='$W'/junit GPU_TEST_TIMEOUT=260 bash scripts/gpu_tests.sh {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/files.txt | tee $W/summary.txt
for f in $W/logs/*.log; do echo "$(basename $f .log): $(grep -E '[0-9]+ (passed|failed|error)' $f | tail -1)"; done | tee $W/results.txt
grep -E "^E  |Error" $W/logs/*.log | head -20
pack; date
echo "== growth-widths"
timeout 180 python3 scripts/gpu/growth-widths.py $W/growth-widths > $W/growth-widths.log 2>&1; echo "rc=$?" >> $W/growth-widths.log
tail -24 $W/growth-widths.log; pack; date
echo "== growth-stages"
timeout 55 python3 scripts/gpu/growth-stages.py $W/growth-stages > $W/growth-stages.log 2>&1; echo "rc=$?" >> $W/growth-stages.log
tail -30 $W/growth-stages.log; pack; date
