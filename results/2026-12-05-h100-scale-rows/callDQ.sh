#!/bin/bash
# callDQ: why a bench-scale shape's target stays allocated after measure_shape (callDP: the 1.3B shape peaked
# at 57.6 GiB after the 27B one): the tiny shape on CUDA, a weakref to its model, the referrers if it lives.
# carry: [".whl", "callDQ.sh", ".triton-cache.txz"]
export REPRO_GIT_SHA=$1
source scripts/gpu_env.sh
W=/tmp/callDQ; mkdir -p $W
timeout -k 10 200 python3 - > $W/probe.log 2>&1 <<'PY'
import gc, sys, weakref, torch
import repro.bench.scale as bs
refs = []
orig = bs.build_target
def spy(*a, **k):
    m = orig(*a, **k); refs.append(weakref.ref(m)); return m
bs.build_target = spy
dev = torch.device("cuda")
for routes in (["ar"], ["ar", "dflash_chain"], ["ar", "ddtree"], ["ar", "dflash_tfm"]):
    cfg = bs.ScaleConfig(shapes=["tiny"], routes={"tiny": routes}, acceptance="mal:3", prompts=1, prompt_len=16,
                         max_new_tokens=8, warmup_tokens=4, dtype="bf16")
    before = torch.cuda.memory_allocated(dev)
    bs.measure_shape("tiny", cfg, dev, bs.parse_acceptance(cfg.acceptance), lambda r: None)
    gc.collect(); torch.cuda.empty_cache()
    m = refs[-1]()
    print(routes, "alive:", m is not None, "allocated MiB before/after:", before / 2**20, torch.cuda.memory_allocated(dev) / 2**20, flush=True)
    if m is not None:
        seen = 0
        for r in gc.get_referrers(m):
            if r is refs or isinstance(r, type(sys._getframe())):
                continue
            print("  referrer:", type(r).__module__, type(r).__qualname__, (list(r)[:12] if isinstance(r, dict) else str(r)[:160]), flush=True)
            for rr in gc.get_referrers(r)[:6]:
                if isinstance(rr, type(sys._getframe())) or rr is refs:
                    continue
                print("    by:", type(rr).__module__, type(rr).__qualname__, (list(rr)[:8] if isinstance(rr, dict) else str(rr)[:120]), flush=True)
        del m
PY
echo "rc=$?" >> $W/probe.log; cat $W/probe.log | tail -60
tar czf $OUT/callDQ.tar.gz -C /tmp callDQ
