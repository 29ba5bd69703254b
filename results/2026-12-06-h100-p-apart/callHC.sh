#!/bin/bash
# callHC: the split tree form with the diagonal blocks' P in programs of their own (p_apart) against the default,
# whole and phase 1 alone (keys_only), both paper shapes and the tiny family's, every variant checked against the
# fused kernel first; then the new GPU test (test_gpu_tree_split_p_apart) and the split form's GPU tests.
# carry: [".whl", "callHC.sh"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callHC; mkdir -p $W
T0=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
timeout -s INT -k 10 240 python3 - > $W/p-apart.txt 2>&1 <<'PY'
import torch
from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as tt

dev = torch.device("cuda")
timer = TimerConfig(warmup_ms=2.0, rep_ms=10.0, graph_replays=5)
print("shape T variant block_rows rel_err_vs_fused us phase1_us")
cases = [("specla", 128), ("weaver", 128), ("specla", 64), ("weaver", 64), ("specla", 256), ("weaver", 256),
         ("specla", 129), ("weaver", 129), ("tiny-qwen35", 33), ("tiny-qwen35", 65)]
for shape, t in cases:
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
    case = bk.make_case(spec, bk.BenchConfig(timer=timer, bf16_precision="tf32"), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "phases"), dev).to("bf16")
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, case.shape.scale, "tf32")
    ref = tt.tree_gdn_fused(*args)[0].float()
    peel = t % 2 == 1 and t > 64
    br = tt.split_tiles(case.n - peel, x.v.shape[1], x.v.shape[2], "tf32")[0]
    for rep in range(2):
        for name, kw in (("default", {"peel": peel}), ("p_apart", {"peel": peel, "p_apart": True})):
            err = ((tt.tree_gdn_split(*args, **kw)[0].float() - ref).norm() / ref.norm()).item()
            if err > 1e-2:
                print(shape, t, name, br, f"{err:.2e}", "FAIL", "-")
                continue
            us = graph_us([lambda kw=kw: tt.tree_gdn_split(*args, **kw)], dev, timer, 40.0)
            p1 = graph_us([lambda kw=kw: tt.tree_gdn_split(*args, keys_only=True, **kw)], dev, timer, 20.0)
            print(shape, t, f"{name}{'+peel' if peel else ''}", br, f"{err:.2e}", f"{us:.2f}", f"{p1:.2f}")
PY
echo "p-apart rc=$? t=$(( $(date +%s) - T0 ))"; cat $W/p-apart.txt
timeout -s INT -k 10 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gdn/test_triton_tree.py \
  -k "p_apart or gpu_tree_split" --junitxml=$W/junit-tree-split.xml > $W/tests.log 2>&1
echo "tests rc=$? t=$(( $(date +%s) - T0 ))"; tail -5 $W/tests.log
tar czf $OUT/callHC.tar.gz -C /tmp callHC; echo "t=$(( $(date +%s) - T0 ))"
