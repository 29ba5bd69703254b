#!/usr/bin/env bash
# one-off device call 1 (2026-12-02 third session)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD REPRO_GIT_SHA=2f2c954042525cbdf5a480bfe086fee6c74eef6f PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
pack() { tar -czf $OUT/call1.tar.gz -C $W . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
echo "== busy-time $(date -u +%T)"; timeout 170 python3 scripts/gpu/busy-time.py $W/busy-time > $W/busy-time.log 2>&1; echo "exit $?" >> $W/busy-time.log; tail -40 $W/busy-time.log; pack
echo "== host-profile $(date -u +%T)"; timeout 120 python3 scripts/gpu/host-profile.py $W/host-profile > $W/host-profile.log 2>&1; echo "exit $?" >> $W/host-profile.log; tail -5 $W/host-profile.log; pack
echo "== eagle-attn $(date -u +%T)"; timeout 130 python3 scripts/gpu/eagle-attn.py $W/eagle-attn > $W/eagle-attn.log 2>&1; echo "exit $?" >> $W/eagle-attn.log; tail -60 $W/eagle-attn.log; pack
echo "== tests $(date -u +%T)"; OUT=$W/gpu-tests GPU_TEST_TIMEOUT=110 bash scripts/gpu_tests.sh tests/drafters/test_eagle_attention.py > $W/gpu-tests.log 2>&1; grep -E "passed|failed|error|==" $W/gpu-tests.log | tail -15; pack
echo "== done $(date -u +%T)"
