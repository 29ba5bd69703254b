#!/bin/bash
# callCF: slot-bench (derive_slot's rows a program x warps), topk-bench of DFlash-TfM's pool at MAX_K 512,
# rows-tune of the folded tiny matrices at 17 rows (chain DFlash's slot), routes A/B default vs fold_drafter
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCF; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCF.tar.gz -C /tmp callCF; }
T0=$(date +%s); date
echo "== slot-bench"
timeout -s INT 80 python3 scripts/gpu/slot-bench.py $W/slot-bench > $W/slot-bench.log 2>&1; echo "rc=$?"
tail -16 $W/slot-bench.log; pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== topk-bench pool"
TOPK_BENCH_ONLY="TfM pool" TOPK_BENCH_MAX_K=512 timeout -s INT 60 python3 scripts/gpu/topk-bench.py $W/topk-bench > $W/topk-bench.log 2>&1; echo "rc=$?"
tail -5 $W/topk-bench.log; pack; echo "t=$(( $(date +%s) - T0 ))"
echo "== rows-tune tiny 17"
ROWS_TUNE_FOLD=1 timeout -s INT 110 python3 scripts/gpu/rows-tune.py $W/rows-tune tiny-qwen35 17 > $W/rows-tune.log 2>&1; echo "rc=$?"
grep -A12 "^| shape | rows" $W/rows-tune.log | head -14; grep -A9 "## The verify step" $W/rows-tune.log | head -10; grep "RowsConfig" $W/rows-tune.log | tail -8
pack; echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "== routes-ab (left ${LEFT}s)"
ROUTES_AB_BUDGET_S=$(( LEFT - 20 )) ROUTES_AB_VARIANTS=default,fold_drafter timeout -s INT $LEFT python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -22 $W/routes-ab.log
pack; date
