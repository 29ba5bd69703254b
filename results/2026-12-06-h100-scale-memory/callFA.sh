#!/bin/bash
# callFA: what keeps the scale shapes' GraphedTarget alive (results/2026-12-06-h100-pipeline-depth: 56.2 GiB
# left after the 27B shape, 3.73 after the 1.3B; every shape's target alive, the tiny one's too, held through
# the cells of GraphedTarget._noting's closures): memory-probe lists the holders above the target with the
# references no GC-tracked object accounts for. tiny first (seconds), then the 1.3B shape.
# carry: [".whl", "callFA.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callFA; mkdir -p $W
pack() { tar czf $OUT/callFA.tar.gz -C /tmp callFA; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -s INT -k 10 300 python3 scripts/gpu/memory-probe.py $W/memory-probe ${SHAPES:-qwen3.6-27b gdn-1.3b tiny} > $W/memory-probe.log 2>&1
echo "probe rc=$?" >> $W/memory-probe.log
tail -3 $W/memory-probe.log
python3 - <<PY
import json
for r in json.load(open("$W/memory-probe/memory-probe.json")):
    print(r["shape"], r["left_gib"], r["target_alive"])
    for h in r.get("holders", []):
        print("  ", h["external_refs"], h["module_dict"], h["object"], "|", h["detail"][:120])
    for f in r.get("frames", []):
        print("   ", f)
PY
pack; save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"; date
