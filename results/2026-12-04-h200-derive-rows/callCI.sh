#!/bin/bash
# callCI: repro run routes (the six routes, n = 12 prompts / 16 turns, bf16, graphed) at the session's defaults
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCI; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCI.tar.gz -C /tmp callCI; }
date
timeout -s INT 330 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -6; tail -3 $W/routes.log; pack; date
