#!/bin/bash
# callEC: DFlash-TfM's best budget on the GPU (tiny-qwen35, bf16, graphed): a smaller tree needs fewer Weaver steps
# (width 4: budget / 4) and a smaller verify (17 nodes: the fused tree kernel), against a lower MAL; the sweep of
# 2026-12-04 (step-graphs, callCM) covered DDTree only (budget 32 best), the CPU sweep of 2026-12-01 timed Python.
# Then Weaver's growth over programs P and warps at the tiny shape (scripts/gpu/growth-programs.py), and the tiny scale GPU test (a shape leaves < 0.01 GiB allocated once gone: left_gpu_gib, b94e78f).
# carry: [".whl", "callEC.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-580}  # seconds this call may take
source scripts/gpu_env.sh
W=/tmp/callEC; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callEC.tar.gz -C /tmp callEC; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT -k 10 $(( LIMIT * 45 / 100 )) python3 -m repro sweep --device cuda --dtype bfloat16 --budget 16,24,32 --routes dflash_tfm \
  --limit 4 --max-new-tokens 128 --out $W/sweep-tfm > $W/sweep-tfm.log 2>&1; echo "sweep rc=$?"
tail -5 $W/sweep-tfm.log; sed -n 1,60p $W/sweep-tfm/report.md 2>/dev/null
pack; echo "t=$(( $(date +%s) - T0 ))"
timeout -s INT -k 10 $(( LIMIT - 20 - ($(date +%s) - T0) < 170 ? LIMIT - 20 - ($(date +%s) - T0) : 170 )) python3 scripts/gpu/growth-programs.py $W/growth-programs > $W/growth-programs.log 2>&1
echo "growth-programs rc=$?"; tail -30 $W/growth-programs.log
pack; echo "t=$(( $(date +%s) - T0 ))"
L=$(( LIMIT - 10 - ($(date +%s) - T0) )); [ $L -lt 60 ] && { echo "no time for the scale test"; save_triton_cache $OUT; exit 0; }
 echo "== the tiny scale GPU test (left_gpu_gib < 0.01; limit $L s)"
timeout -s INT -k 10 $L python3 -m pytest -m gpu -n 0 -q -p no:cacheprovider tests/bench/test_scale.py > $W/test_scale.log 2>&1
echo "rc=$?" >> $W/test_scale.log; tail -4 $W/test_scale.log
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
