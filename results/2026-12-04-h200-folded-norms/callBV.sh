#!/bin/bash
# callBV: scripts/gpu/rows-tune.py at the tiny-qwen35 matrices, 16 and 33 rows, the normed kinds on folded
# weights (ROWS_TUNE_FOLD=1): the sweep per matrix (TUNED_ROWS entries for the folded default), then the
# verify step (cuBLAS, the untuned defaults, the best of the sweep)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBV; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBV.tar.gz -C /tmp callBV; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
ROWS_TUNE_FOLD=1 timeout -s INT 480 python3 scripts/gpu/rows-tune.py $W/rows-tune tiny-qwen35 16,33 > $W/rows-tune.log 2>&1; echo "rc=$?" >> $W/rows-tune.log
grep -B2 -A12 "^| shape | rows" $W/rows-tune.log | head -30; grep -A8 "## The verify step" $W/rows-tune.log; tail -3 $W/rows-tune.log
pack; date
