#!/bin/bash
# callHA: (1) the split tree form with phase 1's state products (terms, the default) against phase 2 computing
# them (terms=False) at today's defaults (64-row blocks, 4 warps, registers walk), both paper shapes, each variant
# checked against the fused kernel first; (2) every GPU test file at one commit (scripts/gpu_tests.sh: 7 side
# by side, heaviest first, a deadline), packed into one archive (a call returns at most 8 files).
# carry: [".whl", "callHA.sh"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callHA; mkdir -p $W
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 150 python3 - > $W/split-terms.txt 2>&1 <<'PY'
import torch
from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as tt

dev = torch.device("cuda")
timer = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
print("shape T variant block_rows rel_err_vs_fused us")
for shape, t in (("weaver", 128), ("weaver", 256), ("weaver", 64), ("specla", 128), ("specla", 64)):
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
    case = bk.make_case(spec, bk.BenchConfig(timer=timer, bf16_precision="tf32"), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "phases"), dev).to("bf16")
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, case.shape.scale, "tf32")
    ref = tt.tree_gdn_fused(*args)[0].float()
    br = tt.split_tiles(case.n, x.v.shape[1], x.v.shape[2], "tf32")[0]
    for name, kw in (("default", {}), ("terms=False", {"terms": False}), ("terms=True", {"terms": True}),
                     ("default again", {}), ("terms=False again", {"terms": False})):
        err = ((tt.tree_gdn_split(*args, **kw)[0].float() - ref).norm() / ref.norm()).item()
        us = graph_us([lambda kw=kw: tt.tree_gdn_split(*args, **kw)], dev, timer, 40.0) if err < 1e-2 else None
        print(shape, t, name.replace(" ", "_"), br, f"{err:.2e}", us if us is None else f"{us:.2f}")
PY
echo "split-terms rc=$? t=$(( $(date +%s) - T0 ))"; cat $W/split-terms.txt
OUT=$W GPU_TEST_JOBS=7 GPU_TEST_DEADLINE=$(( 575 - $(date +%s) + T0 )) bash scripts/gpu_tests.sh > $W/run.log 2>&1
echo "gpu_tests rc=$? t=$(( $(date +%s) - T0 ))" | tee -a $W/run.log; cat $W/summary.txt
for f in $W/log-*.txt; do [ $(stat -c %s $f) -gt 4096 ] && xz -9 $f; done
tar czf $OUT/callHA.tar.gz -C /tmp callHA; echo "t=$(( $(date +%s) - T0 ))"
