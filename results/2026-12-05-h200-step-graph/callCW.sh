#!/bin/bash
# callCW (after the step graph's revert, 7de5e00): the result read around a step-sized graph
# (scripts/gpu/result-copy.py); the GPU stage-clock test at the reverted engine. carry: [".whl", "callCW.sh"]
source scripts/gpu_env.sh
W=/tmp/callCW; mkdir -p $W; date
timeout 200 python3 scripts/gpu/result-copy.py $W/result-copy > $W/result-copy.log 2>&1; echo "exit $?"; tail -14 $W/result-copy.log
timeout -s INT 200 python3 -m pytest -m gpu -n 0 -vv -rA -p no:cacheprovider tests/decoding/test_stage_clock.py > $W/test_stage_clock.log 2>&1; echo "stage clock exit $?"; grep -E "^(PASSED|FAILED|ERROR)|^E  " $W/test_stage_clock.log | head
tar czf $OUT/callCW.tar.gz -C /tmp callCW; date
