#!/bin/bash
# callGQ: every GPU test file at one commit, heaviest first, 7 files side by side; what has not finished by the
# call's end is named in summary.txt. As callGA (whose logs did not come back: at most 8 files return), packed
# into one tar file, with the limits of test_bench_kernels / test_falsify raised after GA cut them.
# carry: [".whl", "callGQ.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callGQ; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $W/gpu.txt
HEAVY="test_triton_tree test_weaver_growth_fused test_scale test_pipelined test_chain_verify test_graphed_chain
 test_graphed test_static_decoder test_chain_gpu test_delayed_commit test_routes_gpu test_bench_kernels
 test_stage_clock test_tree_attention test_triton_commit_indexed test_stacked_commit test_eagle_attention
 test_triton_linear test_falsify test_pdl test_slot_kernels"
ALL=$(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | sort)
: > $W/files.txt
for n in $HEAVY; do echo "$ALL" | grep "/$n.py$" >> $W/files.txt; done
for f in $ALL; do grep -qx "$f" $W/files.txt || echo "$f" >> $W/files.txt; done
wc -l < $W/files.txt
mapfile -t FILES < $W/files.txt
OUT=$W GPU_TEST_JOBS=7 timeout -s TERM -k 10 ${LIMIT:-555} bash scripts/gpu_tests.sh "${FILES[@]}" > $W/run.log 2>&1
echo "gpu_tests rc=$? t=$(( $(date +%s) - T0 ))" | tee -a $W/run.log
for f in "${FILES[@]}"; do n=$(basename $f .py)
  if [ -f $W/log-$n.txt ]; then echo "$n: $(grep -E '^=+ .*(passed|failed|error|no tests ran).* =+$' $W/log-$n.txt | tail -1) $(grep -E '^== .*exit' $W/log-$n.txt | tail -1 | sed 's/.*exit/exit/')"
  else echo "$n: NOT STARTED"; fi
done > $W/summary.txt
cat $W/summary.txt
for f in $W/log-*.txt; do [ $(stat -c %s $f) -gt 4096 ] && xz -9 $f; done
tar czf $OUT/callGQ.tar.gz -C /tmp callGQ; echo "t=$(( $(date +%s) - T0 ))"; date
