#!/bin/bash
# callBN: repro run routes (bf16, graphed) at the 3-D weight-tile growth step, then the GPU tests of the growth
# and of every route on the graphed engine (one pytest per test, 6 at a time)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBN; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBN.tar.gz -C /tmp callBN; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== repro run routes"
timeout -s INT 170 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep -A 24 "^## Summary" $W/routes/report.md | grep "| all"; tail -2 $W/routes.log; pack; date
echo "== GPU tests"
G=tests/drafters/test_weaver_growth_fused.py
B=$G::test_programs_with_grid_barriers_equal_one_program
cat > $W/tests.txt <<T
$B[dtype1-qwen3.6-27b]
$B[dtype0-qwen3.6-27b]
$B[dtype1-tiny]
$B[dtype0-tiny]
$G::test_fused_growth_in_a_cuda_graph_equals_the_torch_growth
$G::test_a_barrier_past_its_spin_cap_sets_the_error_flag
tests/drafters/test_weaver_growth.py
tests/decoding/test_pipelined.py
tests/models/test_graphed.py
T
export TRITON_CACHE_AUTOTUNING=1
timeout 330 xargs -P 6 -I{} bash -c 'n=$(echo "{}" | md5sum | cut -c1-8); echo "{}" > '$W'/logs/$n.log; timeout -s INT -k 10 300 python3 -m pytest -m gpu -n 0 -vv -rA --durations=0 -p no:cacheprovider --junitxml='$W'/junit/$n.xml "{}" >> '$W'/logs/$n.log 2>&1; echo "{} exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; date
