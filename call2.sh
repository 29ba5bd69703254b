#!/usr/bin/env bash
# one-off device call 2 (2026-12-02 third session)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD REPRO_GIT_SHA=fa316f6689a383b9617b019359562df5da2a278a PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
pack() { tar -czf $OUT/call2.tar.gz -C $W . ; }
echo "== busy-time $(date -u +%T)"; timeout 150 python3 scripts/gpu/busy-time.py $W/busy-time > $W/busy-time.log 2>&1; echo "exit $?" >> $W/busy-time.log; grep -A8 "^| route" $W/busy-time.log; pack
echo "== host-profile $(date -u +%T)"; timeout 100 python3 scripts/gpu/host-profile.py $W/host-profile > $W/host-profile.log 2>&1; echo "exit $?" >> $W/host-profile.log; grep "ms/step wall" $W/host-profile.log; pack
echo "== bench kernels $(date -u +%T)"; timeout 190 python3 -m repro bench kernels --shapes specla,weaver,tiny-qwen35 --sizes 32,128 --groups verify,recovery --methods per_branch_recurrent,tree_split,tree_fused,commit_replay_fla,commit_path_fused_conv,commit_path_indexed_conv --depths 1,2,4,16 --warmup-ms 2 --rep-ms 10 --time-budget 140 --out $W/bench-kernels > $W/bench-kernels.log 2>&1; echo "exit $?" >> $W/bench-kernels.log; tail -40 $W/bench-kernels.log; pack
left=$((585 - SECONDS)); echo "== bench scale $(date -u +%T) (limit $left s)"
timeout $left python3 -m repro bench scale --shape gdn-1.3b --acceptance paper-mal --device cuda --dtype bfloat16 --prompts 3 --max-new-tokens 128 --out $W/paper-mal-1.3b > $W/bench-scale.log 2>&1; echo "exit $?" >> $W/bench-scale.log; tail -30 $W/bench-scale.log; pack
echo "== done $(date -u +%T)"
