#!/bin/bash
# callBM: growth-widths at the 3-D weight-tile form (A/B against callBJ's 2-D form; width 1 unchanged: the
# control), then DFlash-TfM's Weaver width swept on the tiny family (ar + dflash_tfm, widths 1, 2, 4, 8)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBM; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBM.tar.gz -C /tmp callBM; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== growth-widths"
timeout 200 python3 scripts/gpu/growth-widths.py $W/growth-widths > $W/growth-widths.log 2>&1; echo "rc=$?" >> $W/growth-widths.log
tail -20 $W/growth-widths.log; pack; date
echo "== sweep width"
timeout -s INT 370 python3 -m repro sweep --param width=1,2,4,8 --routes ar,dflash_tfm --device cuda --dtype bfloat16 \
  --limit 4 --max-new-tokens 128 --out $W/sweep-width > $W/sweep.log 2>&1; echo "rc=$?" >> $W/sweep.log
grep "| all" $W/sweep-width/report.md | head -12; tail -3 $W/sweep.log; pack; date
