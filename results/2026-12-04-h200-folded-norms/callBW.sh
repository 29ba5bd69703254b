#!/bin/bash
# callBW: the folded normed kinds with the sum of squares in a second pass over x: the GPU tests of the
# row-tiled kernels (the tiles that failed in callBV / callBU included), then scripts/gpu/rows-tune.py with
# ROWS_TUNE_FOLD=1 at tiny-qwen35 (16, 33 rows) and GDN-1.3B (64 rows): every configuration's check and time
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBW; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBW.tar.gz -C /tmp callBW; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== GPU tests"
timeout -s INT 150 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/gdn/test_triton_linear_rows.py > $W/tests.log 2>&1; echo "rc=$?" >> $W/tests.log
grep -hE "^(PASSED|FAILED|ERROR)|^E  |rc=" $W/tests.log | head -20
pack; date
for shape in "tiny-qwen35 16,33" "gdn-1.3b 64"; do
  set -- $shape; echo "== rows-tune $1 $2"
  ROWS_TUNE_FOLD=1 timeout -s INT 200 python3 scripts/gpu/rows-tune.py $W/rows-tune-$1 $1 $2 > $W/rows-tune-$1.log 2>&1; echo "rc=$?" >> $W/rows-tune-$1.log
  grep -A12 "^| shape | rows" $W/rows-tune-$1.log | head -14; grep -A9 "## The verify step" $W/rows-tune-$1.log | head -10; tail -1 $W/rows-tune-$1.log
  pack; date
done
