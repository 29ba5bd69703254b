#!/bin/bash
# callBO: repro run routes (bf16, graphed) at the 3-D weight-tile growth step on a cold Triton cache (callBN's
# 170 s limit ended it before its first record), then the 27B scale rows with the paper's MALs replayed
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBO; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBO.tar.gz -C /tmp callBO; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== repro run routes"
timeout -s INT 290 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep -A 24 "^## Summary" $W/routes/report.md | grep "| all"; grep -E "elapsed" $W/routes.log | head -3; tail -2 $W/routes.log; pack; date
echo "== scale 27B"
timeout -s INT 280 python3 -m repro bench scale --shape qwen3.6-27b --routes ar,dflash_chain,ddtree,dflash_tfm \
  --acceptance paper-mal --device cuda --dtype bfloat16 --prompts 16 --max-new-tokens 256 \
  --out $W/paper-mal > $W/scale.log 2>&1; echo "rc=$?" >> $W/scale.log
tail -4 $W/scale.log; grep -A 12 "^## " $W/paper-mal/report.md | head -30; pack; date
