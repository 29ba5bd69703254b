#!/bin/bash
# callDB: is a speedup between two nights real? `repro run routes` twice more at the same commit as callDA's run
# (each a fresh process), then `repro compare` of every pair: identical code should show no change beyond
# compare's noise floor (min_effect 3%); chain DFlash moved 12% between two processes in callCY / callCZ.
# usage: bash callDB.sh SHA DA_ROUTES (callDA's routes run directory, committed and carried in the tree)
# carry: [".whl", "callDB.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
DA=$2
source scripts/gpu_env.sh
W=/tmp/callDB; mkdir -p $W
pack() { find $W -name "*.lock" -delete; tar czf $OUT/callDB.tar.gz -C /tmp callDB; }
T0=$(date +%s); date
for i in 1 2; do
  LEFT=$(( 280 * i - ($(date +%s) - T0) ))
  timeout -s INT $LEFT python3 -m repro run routes --device cuda --dtype bfloat16 --engine graphed --out $W/routes-$i > $W/routes-$i.log 2>&1; echo "rc=$?" >> $W/routes-$i.log
  grep "| all" $W/routes-$i/report.md | head -8; tail -1 $W/routes-$i.log; pack
done
for pair in "$DA $W/routes-1" "$DA $W/routes-2" "$W/routes-1 $W/routes-2"; do
  set -- $pair; n=$(basename $1)-$(basename $2)
  python3 -m repro compare $1 $2 --out $W/compare-$n.md > $W/compare-$n.log 2>&1; echo "compare $n rc=$?"; tail -3 $W/compare-$n.log
done
pack; echo "t=$(( $(date +%s) - T0 ))"; date
