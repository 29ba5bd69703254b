#!/usr/bin/env bash
# The gpu-marked tests on the device machine, one test file at a time, each under its own time limit so
# that a slow or hung file cannot hide the others: -vv (the project's addopts add -q) prints every test
# as it finishes, --durations=0 the time of each at the end of its file, faulthandler dumps the stacks
# of a test still running 10 s before the file's limit, the limit interrupts pytest (SIGINT: it reports
# where it stopped and writes its junit file; SIGKILL 15 s later), and each file writes
# $OUT/junit-<file>.xml. Called by gpu_model_bench.sh and gpu_bench.sh after they set PYTHONPATH.
#
#   scripts/gpu_tests.sh [test files...]   (default: every tests/**/test_*.py with gpu tests, the model
#                                           path's first: static decoder, Triton tree kernels)
#   GPU_TEST_LIST=1 scripts/gpu_tests.sh    (print the files it would run, one a line, and run nothing)
#
# Environment: OUT (default runs/gpu-tests); GPU_TEST_JOBS=<n> runs n files side by side, each file's output
# in $OUT/log-<file>.txt (2026-12-03, 6 side by side: 31 of 36 files within one call, five slow ones past
# their limits while compiles shared the 16 cores: give those more time); GPU_TEST_TIMEOUT=<s> sets every
# file's limit, else each file
# has its own below (640 s in all; the default set, 35 tests, took 334 s on one H200 on 2026-11-30, most of
# it process start-up, Triton compiles and fla's autotuning, which TRITON_CACHE_AUTOTUNING=1 lets later
# processes reuse); REPRO_GPU_FULL=1 adds the extended matrices (minutes more: raise the limits).
# GPU_TEST_DEADLINE=<s>: the whole run ends within s seconds: each file's limit is cut to what is left, and a
# file with under 30 s left is not started. With jobs the files start heaviest first (by their limits).
# Every run ends with $OUT/summary.txt: a line a file (exit, seconds, tests / failures / errors / skipped from
# its junit file, or "not started"). The whole suite in one device call (2026-12-06, H100, 42 files in 336 s):
#   OUT=/tmp/suite GPU_TEST_JOBS=7 GPU_TEST_DEADLINE=555 bash scripts/gpu_tests.sh; tar czf $OUT/suite.tgz ...
# Exit status: 0 when every file passed (or had no gpu tests selected), else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/gpu-tests}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
  mapfile -t FILES < <({ echo tests/models/test_static_decoder.py; echo tests/gdn/test_triton_tree.py
    grep -rlE --include="test_*.py" "^@pytest\.mark\.gpu|^ +pytest\.mark\.gpu,|^pytestmark.*pytest\.mark\.gpu" tests
  } | awk '!seen[$0]++')  # files that mark a test gpu (not those that only write the marker into a string)
fi
if [ "${GPU_TEST_LIST:-0}" = 1 ]; then printf '%s\n' "${FILES[@]}"; exit 0; fi
limit_of() {  # seconds for one file: start-up (~10 s: torch, CUDA context) + compiles + the tests
  case $(basename "$1" .py) in
    test_static_decoder) echo 120 ;; # 11 tests: graphs of every step, fused, gemv, unfused (79 s)
    test_triton_tree) echo 360 ;;    # paper shapes, split / peel, blocked, pending: ~290 s alone in two parts after a kernel change (2026-12-06)
    test_chain_gpu) echo 120 ;;      # fla's chunk forward (autotuned: ~55 s) and training gradients
    test_bench_kernels) echo 120 ;;  # one shape of the kernel bench without fla's chunk kernels (39 s alone; 60 s cut it 7 files side by side, 2026-12-06)
    test_routes_gpu) echo 200 ;;     # every route vs AR on CUDA (56 s alone; 100 s cut it 6 files side by side)
    test_graphed) echo 240 ;;        # every gpu-smoke route through the graphed target; budget-128 trees (88 s alone)
    test_graphed_chain) echo 150 ;;  # fla_sd on chain slots: fla's chunk kernel autotunes before capture
    test_triton_linear) echo 90 ;;   # GEMV and row-tiled linears at the 1.3B / 27B matrices
    test_triton_decode | test_triton_commit) echo 45 ;;  # fused glue / commit kernels (15 s, 8 s)
    test_chain_verify) echo 300 ;;   # fla's chunk kernel autotuned at both shapes (Weaver's ran past 150 s on 2026-12-01)
    test_weaver_growth_fused) echo 450 ;;  # Triton growth on P programs at the tiny and 27B Weaver shapes (240 s: 4 of 7, side by side)
    test_stacked_commit) echo 150 ;;  # stacked commit in graphs (60 s ran out compiling on 2026-12-01)
    test_tree_attention_split) echo 90 ;;  # the split kernel's compiles
    test_pdl) echo 150 ;;  # a decode graph each of six ways (three PDL levels to compile)
    test_device_acceptance) echo 90 ;;     # acceptance rules in graphs
    test_pipelined) echo 300 ;;  # the pipelined routes on CUDA graphs, greedy and sample_match, depths 1-2 (compiles)
    test_falsify) echo 300 ;;        # every tree kernel against the float64 recurrence (compiles; 150 s cut it 7 files side by side, 2026-12-06)
    test_scale) echo 180 ;;          # the tiny scale run on CUDA graphs compiles every route (60 s cut it on 2026-12-02)
    test_eagle_fast | test_dflash_fast) echo 120 ;;  # drafters' fast forwards: compiles, graphed targets
    test_tree_attention) echo 120 ;; # the tree attention kernel's compiles (~14) and a graphed decoder
    test_slot_kernels) echo 120 ;;   # the slot kernels at 25 tree sizes (compiles) and two graphed targets
    *) echo 60 ;;
  esac
}
run_file() {  # one file under its limit; its output into $OUT/log-<file>.txt when jobs run side by side
  local f=$1 name limit start rc
  name=$(basename "$f" .py)
  limit=${GPU_TEST_TIMEOUT:-$(limit_of "$f")}
  if [ -n "${SUITE_END:-}" ]; then  # GPU_TEST_DEADLINE: at most what is left
    local left=$((SUITE_END - $(date +%s)))
    if [ "$left" -lt 30 ]; then
      echo "== $f: not started (${left} s left of the deadline)"
      echo "$name not-started 0" >> "$OUT/exits.txt"
      return 1
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== pytest -m gpu $f (limit ${limit} s; $(date -u +%T))"
  start=$SECONDS
  timeout -s INT -k 15 "$limit" python3 -m pytest -m gpu -n 0 -vv -rA --durations=0 -p no:cacheprovider \
    -o faulthandler_timeout=$((limit > 20 ? limit - 10 : 10)) --junitxml="$OUT/junit-$name.xml" "$f"
  rc=$?
  echo "== $f: exit $rc after $((SECONDS - start)) s$([ $rc -eq 124 ] && echo ' (time limit)')"
  echo "$name $rc $((SECONDS - start))" >> "$OUT/exits.txt"
  [ $rc -eq 0 ] || [ $rc -eq 5 ]  # 5: no tests selected
}
summary() {  # $OUT/summary.txt: a line a file, in the order given
  local f name rc secs counts
  for f in "${FILES[@]}"; do
    name=$(basename "$f" .py)
    read -r rc secs < <(awk -v n="$name" '$1 == n {print $2, $3}' "$OUT/exits.txt")
    counts=$(grep -o -m1 '<testsuite [^>]*' "$OUT/junit-$name.xml" 2>/dev/null \
      | grep -oE '(tests|failures|errors|skipped)="[0-9]+"' | tr -d '"' | tr '\n' ' ')
    case ${rc:-} in
      "") echo "$name: not run" ;;
      not-started) echo "$name: not started (deadline)" ;;
      *) echo "$name: exit $rc after $secs s$([ "$rc" = 124 ] && echo ' (time limit)'); ${counts:-no junit}" ;;
    esac
  done > "$OUT/summary.txt"
}
: > "$OUT/exits.txt"
[ -n "${GPU_TEST_DEADLINE:-}" ] && SUITE_END=$(($(date +%s) + GPU_TEST_DEADLINE))
status=0
if [ "${GPU_TEST_JOBS:-1}" -gt 1 ]; then  # files side by side (the whole suite in one device call)
  mapfile -t FILES < <(for f in "${FILES[@]}"; do echo "$(limit_of "$f") $f"; done | sort -s -k1,1nr | cut -d' ' -f2-)
  export OUT GPU_TEST_TIMEOUT SUITE_END
  export -f run_file limit_of
  printf '%s\n' "${FILES[@]}" | xargs -P "$GPU_TEST_JOBS" -I{} bash -c \
    'f={}; n=$(basename "$f" .py); if run_file "$f" > "$OUT/log-$n.txt" 2>&1; then r=ok; else r=FAILED; fi
     echo "== $f: $r ($(tail -1 "$OUT/log-$n.txt"))"; [ $r = ok ]' || status=1
else
  for f in "${FILES[@]}"; do
    run_file "$f" || status=1
  done
fi
summary
exit $status
