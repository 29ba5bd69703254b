#!/bin/bash
# callBI: DFlash-TfM's Weaver width swept on the tiny family (bf16, graphed), then the 27B scale rows with
# the paper's MALs replayed (ar, chain DFlash, DDTree, DFlash-TfM at w = 4)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBI; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBI.tar.gz -C /tmp callBI; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== sweep width"
timeout 170 python3 -m repro sweep --param width=1,2,4,8 --routes ar,dflash_tfm --device cuda --dtype bfloat16 \
  --limit 4 --max-new-tokens 128 --out $W/sweep-width > $W/sweep.log 2>&1; echo "rc=$?" >> $W/sweep.log
tail -30 $W/sweep-width/report.md; tail -2 $W/sweep.log; pack; date
echo "== scale 27B"
timeout 380 python3 -m repro bench scale --shape qwen3.6-27b --routes ar,dflash_chain,ddtree,dflash_tfm \
  --acceptance paper-mal --device cuda --dtype bfloat16 --prompts 16 --max-new-tokens 256 \
  --out $W/paper-mal > $W/scale.log 2>&1; echo "rc=$?" >> $W/scale.log
tail -4 $W/scale.log; grep -A 12 "^## " $W/paper-mal/report.md | head -40; pack; date
