#!/bin/bash
# callBL: the grid-barrier GPU test in bf16 at the 27B shape (widths 1 and 4), and the spin cap
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBL; mkdir -p $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBL.tar.gz -C /tmp callBL; }
F=tests/drafters/test_weaver_growth_fused.py
timeout -s INT -k 10 120 python3 -m pytest -m gpu -n 0 -rA -p no:cacheprovider "$F::test_programs_with_grid_barriers_equal_one_program[dtype1-qwen3.6-27b]" "$F::test_a_barrier_past_its_spin_cap_sets_the_error_flag" > $W/logs/fused.log 2>&1; echo "rc=$?" >> $W/logs/fused.log
tail -5 $W/logs/fused.log; grep -E "^E  " $W/logs/fused.log | head; pack
