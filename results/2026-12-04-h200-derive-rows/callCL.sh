#!/bin/bash
# callCL: verify-kernels with VERIFY_KERNELS_FORMS=1 (the 17- and 33-node verify steps on each tree kernel form)
SHA=$1
export REPRO_GIT_SHA=$SHA
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/callCL; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callCL.tar.gz -C /tmp callCL; }
date
VERIFY_KERNELS_FORMS=1 timeout -s INT 190 python3 scripts/gpu/verify-kernels.py $W/verify-kernels > $W/verify-kernels.log 2>&1; echo "rc=$?"
head -12 $W/verify-kernels/verify-kernels.md; grep -A14 "## The verify step by tree" $W/verify-kernels/verify-kernels.md; tail -3 $W/verify-kernels.log; pack; date
