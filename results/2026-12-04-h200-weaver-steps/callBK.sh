#!/bin/bash
# callBK: the growth GPU tests BJ did not finish (graphed growth vs host at width 4; grid barriers in bf16 at the tiny
# and 27B shapes, widths 1 and 4; the spin cap), then DFlash-TfM's Weaver width swept on the tiny family
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBK; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBK.tar.gz -C /tmp callBK; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
F=tests/drafters/test_weaver_growth_fused.py::test_programs_with_grid_barriers_equal_one_program
(timeout -s INT -k 10 130 python3 -m pytest -m gpu -n 0 -v -rA -p no:cacheprovider tests/drafters/test_weaver_growth.py > $W/logs/growth.log 2>&1; echo "rc=$?" >> $W/logs/growth.log) &
(timeout -s INT -k 10 130 python3 -m pytest -m gpu -n 0 -v -rA -p no:cacheprovider "$F[dtype1-tiny]" "$F[dtype1-qwen3.6-27b]" tests/drafters/test_weaver_growth_fused.py::test_a_barrier_past_its_spin_cap_sets_the_error_flag > $W/logs/fused.log 2>&1; echo "rc=$?" >> $W/logs/fused.log) &
wait
for f in $W/logs/*.log; do echo "== $f"; grep -E "PASSED|FAILED|rc=" $f | tail -5; done; grep -E "^E  " $W/logs/*.log | head; pack; date
echo "== sweep width"
timeout 150 python3 -m repro sweep --param width=1,2,4,8 --routes ar,dflash_tfm --device cuda --dtype bfloat16 \
  --limit 4 --max-new-tokens 128 --out $W/sweep-width > $W/sweep.log 2>&1; echo "rc=$?" >> $W/sweep.log
grep "| all" $W/sweep-width/report.md | head -12; tail -2 $W/sweep.log; pack; date
