#!/bin/bash
# callDI: the claims ledger's papers' tables on the GPU engine at HEAD (bf16, graphed, defaults):
# `repro run table2` (W1-W4), `repro run specla` (S1-S3), then `repro run routes --set switches.fuse_accept=false`
# (acceptance and commit as their own stage) while time is left.
# carry: [".whl", "callDI.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDI; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDI.tar.gz -C /tmp callDI; }
T0=$(date +%s); date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
left() { echo $(( 575 - ($(date +%s) - T0) )); }
run() {  # name, limit seconds, repro run args...
  local name=$1 lim=$2; shift 2
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  [ "$lim" -lt 30 ] && { echo "== $name: no time left"; return; }
  echo "== $name (limit $lim s, t=$(( $(date +%s) - T0 )))"
  timeout -s INT -k 10 $lim python3 -m repro run "$@" --device cuda --dtype bfloat16 --engine graphed \
    --out $W/$name > $W/$name.log 2>&1; echo "rc=$?" >> $W/$name.log
  tail -3 $W/$name.log; grep -E "^\| (all|mixed)" $W/$name/report.md 2>/dev/null | head -12
  pack
}
run table2-bf16-graphed 260 table2
run specla-bf16-graphed 200 specla
run routes-split-accept 200 routes --set switches.fuse_accept=false
save_triton_cache $OUT
echo "t=$(( $(date +%s) - T0 ))"; date
