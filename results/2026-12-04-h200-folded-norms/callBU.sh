#!/bin/bash
# callBU: scripts/gpu/rows-tune.py at the GDN-1.3B shape, 64 rows, the normed kinds on folded weights
# (ROWS_TUNE_FOLD=1): each matrix's row-tiled sweep against cuBLAS, then the verify step (fuse_verify off =
# cuBLAS, on at the untuned defaults, on with the sweep's best tiles; the decoder folds by default)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBU; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBU.tar.gz -C /tmp callBU; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
ROWS_TUNE_FOLD=1 timeout -s INT 420 python3 scripts/gpu/rows-tune.py $W/rows-tune gdn-1.3b 64 > $W/rows-tune.log 2>&1; echo "rc=$?" >> $W/rows-tune.log
grep -B2 -A12 "^| shape | rows" $W/rows-tune.log | head -30; grep -A8 "## The verify step" $W/rows-tune.log; tail -3 $W/rows-tune.log
pack; date
