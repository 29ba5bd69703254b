#!/bin/bash
# callCZ (the command as it ran, inline, at 1e3e2ef; carry: [".whl"]): callCY's routes A/B again with room for
# its second variant (CY's default variant compiled for 141 s and left the host_writes variant no budget).
export REPRO_GIT_SHA=1e3e2ef; source scripts/gpu_env.sh; W=/tmp/callCZ; mkdir -p $W
ROUTES_AB_BUDGET_S=400 ROUTES_AB_VARIANTS=default,host_writes timeout -s INT 430 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "exit $?"
grep -v "^{" $W/routes-ab.log | tail -20; tar czf $OUT/callCZ.tar.gz -C /tmp callCZ
