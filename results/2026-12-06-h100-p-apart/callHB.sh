#!/bin/bash
# callHB: the GEMV launch configurations of every decode matrix swept on this card (scripts/gpu/gemv-tune.py:
# the TUNED table was measured on an H200), and the GDN-1.3B decode step under the best ones found.
# carry: [".whl", "callHB.sh"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callHB; mkdir -p $W
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 400 python3 scripts/gpu/gemv-tune.py $W/gemv-tune > $W/gemv-tune.log 2>&1
echo "gemv-tune rc=$? t=$(( $(date +%s) - T0 ))"; tail -60 $W/gemv-tune.log
tar czf $OUT/callHB.tar.gz -C /tmp callHB; echo "t=$(( $(date +%s) - T0 ))"
