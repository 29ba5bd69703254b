#!/bin/bash
# callCP: repro run routes at the session's final defaults (FUSE_ACCEPT on, step chains reverted)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCP; mkdir -p $W
T0=$(date +%s); date
timeout -s INT 185 python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes > $W/routes.log 2>&1; echo "rc=$?" >> $W/routes.log
grep "| all" $W/routes/report.md | head -6; tail -2 $W/routes.log
find $W -name "*.lock" -delete; tar czf $OUT/callCP.tar.gz -C /tmp callCP; echo "t=$(( $(date +%s) - T0 ))"
