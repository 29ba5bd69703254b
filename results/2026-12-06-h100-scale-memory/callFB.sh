#!/bin/bash
# callFB: the scale shapes' memory once measure_shape collects after decode_shape's frame is gone (b1342b6):
# memory-probe at the 27B, 1.3B and tiny shapes (before: every target alive after its shape, 56.2 GiB left
# after the 27B one), then the scale GPU test (the tiny shape on CUDA graphs).
# carry: [".whl", "callFB.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callFB; mkdir -p $W
pack() { tar czf $OUT/callFB.tar.gz -C /tmp callFB; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -s INT -k 10 300 python3 scripts/gpu/memory-probe.py $W/memory-probe qwen3.6-27b gdn-1.3b tiny > $W/memory-probe.log 2>&1
echo "probe rc=$?" >> $W/memory-probe.log
tail -2 $W/memory-probe.log
python3 - <<PY
import json
for r in json.load(open("$W/memory-probe/memory-probe.json")):
    print(r["shape"], "peak", r["peak_gib"], "left", r["left_gib"], "target alive", r["target_alive"], "decoder alive", r["decoder_alive"])
PY
pack
timeout -s INT -k 10 150 python3 -m pytest -m gpu -n 0 -q -p no:cacheprovider -rs tests/bench/test_scale.py > $W/test_scale.log 2>&1
echo "pytest rc=$?" >> $W/test_scale.log; tail -3 $W/test_scale.log
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
