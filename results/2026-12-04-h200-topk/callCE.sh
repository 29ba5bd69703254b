#!/bin/bash
# callCE: routes A/B in one process: default (1024-entry top-k chunks), topk_chunk512, topk_pool (DFlash-TfM's
# pool of 512 on the kernels)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCE; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCE.tar.gz -C /tmp callCE; }
date
ROUTES_AB_BUDGET_S=170 ROUTES_AB_VARIANTS=default,topk_chunk512,topk_pool timeout -s INT 250 python3 scripts/gpu/routes-ab.py $W/routes-ab > $W/routes-ab.log 2>&1; echo "routes-ab exit $?"
tail -22 $W/routes-ab.log
pack; date
