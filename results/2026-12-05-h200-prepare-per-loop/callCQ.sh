#!/bin/bash
# callCQ (a session's first device call): the GPU tests of the files the restructure, the unmeasured switches
# (GATED_OUT_PROJ, FUSE_TREE), the prepare-per-loop and the prompt-keyed sampling touch (6 files at a time), then
# SpecLA's check 2 on every Triton tree kernel; the Triton cache saved for the next calls.
# carry: [".whl", "callCQ.sh"] (+ ".triton-cache.tgz" if any)
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callCQ; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCQ.tar.gz -C /tmp callCQ; }
T0=$(date +%s); date
printf '%s\n' tests/models/test_fused_verify.py tests/decoding/test_pipelined.py tests/models/test_graphed.py \
  tests/drafters/test_dflash_fast.py tests/drafters/test_dflash_static.py tests/drafters/test_weaver_growth_fused.py \
  tests/drafters/test_eagle_fast.py tests/drafters/test_eagle_static.py tests/gdn/test_triton_linear_rows.py \
  tests/models/test_static_decoder.py tests/models/test_graphed_chain.py tests/drafters/test_weaver_growth.py \
  tests/gdn/test_tree_attention.py tests/gdn/test_context_kv.py tests/drafters/test_ingest_kernels.py \
  tests/decoding/test_device_acceptance.py tests/harness/test_falsify.py > $W/tests.txt
timeout 420 xargs -P 6 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 5 300 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort > $W/results.txt; grep -v ^PASSED $W/results.txt
echo "passed: $(grep -c ^PASSED $W/results.txt)"; grep -hE "^E  " $W/logs/*.log | head -20
# SpecLA's check 2 on every Triton tree kernel (fused, split, blocked): the split kernel's first run
timeout -s INT 120 python3 -m repro falsify tree-exactness --device cuda --backend triton --out $W/tree-exactness > $W/tree-exactness.log 2>&1; echo "tree-exactness exit $?"; grep -c "| pass" $W/tree-exactness/report.md; grep FAIL $W/tree-exactness/report.md | head -5
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
