#!/bin/bash
# callBS: a verify's normed linears on weights with the norm scales folded in (fold_norms, the new default):
# GPU tests of the row-tiled kernels, the fused verify (three variants) and every route on the graphed
# engine; scripts/gpu/verify-forms.py (folded / scaled / gemv, per matrix and per verify step); repro run
# routes (bf16, graphed) at the new default
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callBS; mkdir -p $W/junit $W/logs
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callBS.tar.gz -C /tmp callBS; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
date
echo "== GPU tests"
cat > $W/tests.txt <<T
tests/gdn/test_triton_linear_rows.py
tests/models/test_fused_verify.py
tests/models/test_graphed.py
tests/decoding/test_pipelined.py
tests/drafters/test_dflash_fast.py
T
export TRITON_CACHE_AUTOTUNING=1
timeout 230 xargs -P 5 -I{} bash -c 'n=$(echo "{}" | md5sum | cut -c1-8); echo "{}" > '$W'/logs/$n.log; timeout -s INT -k 10 215 python3 -m pytest -m gpu -n 0 -vv -rA --durations=0 -p no:cacheprovider --junitxml='$W'/junit/$n.xml "{}" >> '$W'/logs/$n.log 2>&1; echo "{} exit $?"' < $W/tests.txt | tee $W/summary.txt
grep -hE "^(PASSED|FAILED|ERROR)" $W/logs/*.log | sort | tee $W/results.txt
grep -hE "^E  " $W/logs/*.log | head -20
pack; date
echo "== verify forms"
timeout -s INT 150 python3 scripts/gpu/verify-forms.py $W/verify-forms > $W/verify-forms.log 2>&1; echo "rc=$?" >> $W/verify-forms.log
tail -32 $W/verify-forms.log
pack; date
echo "== repro run routes"
timeout -s INT 120 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep -A 24 "^## Summary" $W/routes/report.md | grep "| all"; tail -2 $W/routes.log; pack; date
