#!/bin/bash
# callCJ: step-gaps (profiler traces of graphed generations: device gaps between launches, with and without
# the engine's timing events)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCJ; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCJ.tar.gz -C /tmp callCJ; }
date
timeout -s INT 280 python3 scripts/gpu/step-gaps.py $W/step-gaps > $W/step-gaps.log 2>&1; echo "rc=$?"
tail -16 $W/step-gaps.log; pack; date
