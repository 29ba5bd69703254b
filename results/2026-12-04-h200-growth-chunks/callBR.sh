#!/bin/bash
# callBR: the GPU tests of Weaver's growth (the 27B step's chunked W_e / down linears since e1373bc:
# grid-barrier programs equal one program, bf16 / fp32; graphs; routes on the graphed engine), then
# scripts/gpu/growth-widths.py (time per step at widths 1-8, tiny and Qwen3.6-27B)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBR; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBR.tar.gz -C /tmp callBR; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
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
timeout 280 xargs -P 6 -I{} bash -c 'n=$(echo "{}" | md5sum | cut -c1-8); echo "{}" > '$W'/logs/$n.log; timeout -s INT -k 10 260 python3 -m pytest -m gpu -n 0 -vv -rA --durations=0 -p no:cacheprovider --junitxml='$W'/junit/$n.xml "{}" >> '$W'/logs/$n.log 2>&1; echo "{} exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; date
echo "== growth widths"
timeout -s INT 210 python3 scripts/gpu/growth-widths.py $W/growth-widths > $W/growth-widths.log 2>&1; echo "rc=$?" >> $W/growth-widths.log
tail -40 $W/growth-widths.log
pack; date
