#!/bin/bash
# callBP: the verify linears' "gemv" form (GEMV kernel over groups of 4 rows) against the row-tiled "dot"
# form: GPU tests of both forms, scripts/gpu/verify-forms.py, then repro run routes with each form
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBP; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBP.tar.gz -C /tmp callBP; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== GPU tests"
printf '%s\n' tests/gdn/test_triton_linear_rows.py tests/models/test_fused_verify.py tests/gdn/test_triton_linear.py > $W/files.txt
timeout 175 xargs -P 3 -I{} bash -c 'n=$(basename {} .py); timeout -s INT -k 10 160 python3 -m pytest -m gpu -n 0 -vv -rA --durations=0 -p no:cacheprovider --junitxml='$W'/junit/$n.xml {} > '$W'/logs/$n.log 2>&1; echo "$n exit $?"' < $W/files.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; date
echo "== verify-forms"
timeout 130 python3 scripts/gpu/verify-forms.py $W/verify-forms > $W/verify-forms.log 2>&1; echo "rc=$?" >> $W/verify-forms.log
tail -40 $W/verify-forms.log; pack; date
echo "== routes gemv"
REPRO_VERIFY_ROWS=gemv timeout -s INT 120 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes-gemv > $W/routes-gemv.log 2>&1; echo "rc=$?" >> $W/routes-gemv.log
grep -A 24 "^## Summary" $W/routes-gemv/report.md | grep "| all"; tail -2 $W/routes-gemv.log; pack; date
echo "== routes dot"
timeout -s INT 100 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes-dot > $W/routes-dot.log 2>&1; echo "rc=$?" >> $W/routes-dot.log
grep -A 24 "^## Summary" $W/routes-dot/report.md | grep "| all"; tail -2 $W/routes-dot.log; pack; date
