#!/bin/bash
# callDM: S1-scale (the GDN-1.3B shape, paper MALs) and the records-acceptance rows again after aba2c6d
# (replayed draws out of the decode clock) and 5ed031c (stacked weights held once: the 27B shape fits an H100).
# carry: [".whl", "callDM.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDM; mkdir -p $W
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
left() { echo $(( 570 - ($(date +%s) - T0) )); }
scale() {  # name, limit seconds, bench scale args...
  local name=$1 lim=$2; shift 2
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  [ "$lim" -lt 30 ] && { echo "== $name: no time left"; return; }
  echo "== $name (limit $lim s, t=$(( $(date +%s) - T0 )))"
  timeout -s INT -k 10 $lim python3 -m repro bench scale "$@" --device cuda --dtype bfloat16 --out $W/$name \
    > $W/$name.log 2>&1; echo "rc=$?" >> $W/$name.log
  grep -E "^\| (qwen|gdn)" $W/$name.log | cut -c1-200; tail -2 $W/$name.log
  find $W -name "*.lock" -delete; tar czf $OUT/callDM.tar.gz -C /tmp callDM
}
scale paper-mal-1.3b 200 --shape gdn-1.3b --acceptance paper-mal --prompts 16 --max-new-tokens 256
scale records-acceptance 360 --shape qwen3.6-27b,gdn-1.3b \
  --acceptance records:results/2026-12-05-h100-stores-in-graphs/routes --prompts 8 --max-new-tokens 128
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
