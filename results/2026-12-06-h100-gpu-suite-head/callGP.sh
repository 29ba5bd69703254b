#!/bin/bash
# callGP (next session, after callGA.sh's whole GPU suite; kind nvidia-h200 for the issues' H200 rows): the six routes
# on the tiny family at HEAD (`repro run routes`, bf16, graphed), then the issue-13 verify rows side by side
# (`repro bench kernels --groups verify`, SpecLA and Weaver shapes, T = 16-256 and the 129-node production tree).
# carry: [".whl", "callGP.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
LIMIT=${2:-570}
source scripts/gpu_env.sh
W=/tmp/callGP; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callGP.tar.gz -C /tmp callGP; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
timeout -s INT -k 10 $(cap 200) python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed \
  --out $W/routes > $W/routes.log 2>&1; echo "routes rc=$? t=$(( $(date +%s) - T0 ))"
grep -E "^\| all" $W/routes/report.md 2>/dev/null | head -14; pack
timeout -s INT -k 10 $(left) python3 -m repro bench kernels --out $W/bench-kernels --groups verify \
  --shapes specla,weaver --sizes 16,32,64,128,129,256 > $W/bench-kernels.log 2>&1
echo "bench kernels rc=$? t=$(( $(date +%s) - T0 ))"; tail -3 $W/bench-kernels.log; pack
save_triton_cache $OUT; echo "t=$(( $(date +%s) - T0 ))"
