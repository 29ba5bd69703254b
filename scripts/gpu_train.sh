#!/usr/bin/env bash
# Train the tiny family on the device machine (one H200): tiny-qwen35 (3 GDN : 1 gated attention)
# and tiny-gdn (pure GDN, fla format), then DFlash, EAGLE and Weaver drafters for each. The recipes are the
# `repro train` commands below, nothing else; every run writes its checkpoint, train_log.jsonl,
# loss.png, metrics.json and manifest.json. Carry: [".whl", "data/corpus", "data/tokenizer"]
# (build the last two with `repro data corpus` and `repro data tokenizer`). Results: $OUT/family.tgz,
# repacked after every stage so that a cut run still returns what finished. STAGES names the members
# to train, in order (default: all of them; one H200 call of 10 minutes fits about five).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-train}
RUNS=runs/family
STAGES=${STAGES:-"tiny-qwen35 tiny-gdn tiny-qwen35-dflash tiny-gdn-dflash tiny-qwen35-eagle tiny-gdn-eagle tiny-qwen35-weaver tiny-gdn-weaver"}
mkdir -p "$OUT" "$RUNS"
source scripts/gpu_env.sh  # wheels, PYTHONPATH, the carried Triton cache
pack() { tar czf "$OUT/family.tgz" -C runs family; }
stage() {  # stage NAME SECONDS repro-train-args...
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date -u +%T))"
  timeout "$limit" python3 -m repro train "$@" 2>&1 | tee "$RUNS/$name.log" | tail -40
  echo "== $name exit ${PIPESTATUS[0]}"
  pack
}
{
  date -u +"%F %T UTC"
  python3 -c 'import sys, torch, triton, fla; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| triton", triton.__version__, "| fla", fla.__version__, "| cuda", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "== the chain path on this GPU (fla's chunk forward and training gradients vs the reference)"
  OUT=/tmp/gpu-tests bash scripts/gpu_tests.sh tests/models/test_chain_gpu.py
} 2>&1 | tee "$RUNS/env.log"
COMMON_T=(--corpus data/corpus --tokenizer data/tokenizer --layers 8 --hidden-size 192 --seq-len 512
  --batch-size 32 --steps 2400 --lr 3e-3 --warmup 100 --tie-embeddings --save-dtype bfloat16 --device cuda
  --eval-sequences 256 --seed 0)
DISTILL=(--corpus data/corpus --prompts 2048 --prompt-len 64 --distill-new-tokens 128 --batch-size 64 --steps 3000
  --lr 1e-3 --warmup 100 --save-dtype bfloat16 --device cuda --eval-prompts ${EVAL_PROMPTS:-8} --max-new-tokens 96
  --seed 0)
# a member trained earlier in this run is used from $RUNS, else the embedded family member of that name
pick() { if [ -d "$RUNS/$1" ]; then echo "$RUNS/$1"; else echo "$1"; fi; }
for s in $STAGES; do
  case $s in
    tiny-qwen35) stage $s 170 target "${COMMON_T[@]}" --arch qwen35 --out $RUNS/$s --time-budget ${T_BUDGET:-100} ;;
    tiny-gdn) stage $s 170 target "${COMMON_T[@]}" --arch fla_gdn --out $RUNS/$s --time-budget ${T_BUDGET:-100} ;;
    *-dflash) stage $s 170 dflash "${DISTILL[@]}" --target $(pick ${s%-dflash}) --block-size 16 --layers 1 \
        --anchors 8 --out $RUNS/$s --time-budget ${D_BUDGET:-50} ;;
    *-eagle) stage $s 170 eagle "${DISTILL[@]}" --target $(pick ${s%-eagle}) --layers 1 --k 6 \
        --out $RUNS/$s --time-budget ${X_BUDGET:-40} ;;
    *-weaver) stage $s 170 weaver "${DISTILL[@]}" --target $(pick ${s%-weaver}) --dflash $(pick ${s%-weaver}-dflash) \
        --d-model 128 --heads 4 --pool 512 --anchors 8 --budget 32 --width 4 --target-temperature 0.25 --out $RUNS/$s --time-budget ${X_BUDGET:-40} ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
pack
save_triton_cache "$OUT"
ls -la "$OUT"
