"""GPU check + timing of repro.gdn.triton_tree (scratch; not part of the repo)."""
import os, sys, time, json, traceback
sys.path.insert(0, "."); sys.path.insert(0, "tests")
import torch, triton
from triton.testing import do_bench
from test_triton_tree import make_inputs, rel, WEAVER, SPECLA
from repro.gdn import reference as gdn
from repro.gdn.triton_tree import tree_gdn_fused, tree_states_fused
from repro.tree import Tree

F64 = torch.float64
out_dir = os.environ.get("OUT", "/tmp")
log = open(os.path.join(out_dir, "log.txt"), "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

p(torch.__version__, triton.__version__, torch.cuda.get_device_name())
mode = sys.argv[1] if len(sys.argv) > 1 else "all"

def setup(base, n, kind, dtype, seed=1234):
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "seed": seed}
    (q, k, v, g, beta), s0, parents = make_inputs(spec, "cuda")
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    anc = tree.ancestor_mask.cuda()
    scale = base["dk"] ** -0.5
    ro, rf = gdn.tree_gdn(*(x.to(F64) for x in (q, k, v, g, beta, s0)), anc, scale)
    return (q, k, v, g, beta, s0, anc, scale), parents, ro, rf

def variant(args, ro, rf, prec, **kw):
    q, k, v, g, beta, s0, anc, scale = args
    fn = lambda: tree_gdn_fused(q, k, v, g, beta, s0, anc, scale, prec, **kw)
    o, f = fn(); torch.cuda.synchronize()
    eo, ed = rel(o, ro), rel(f.delta, rf.delta)
    t = do_bench(fn, warmup=20, rep=100, return_mode="median") * 1e3
    return eo, ed, t

if mode in ("all", "sweep"):
    for dtype in ("bfloat16", "float32"):
        args, parents, ro, rf = setup(WEAVER, 128, "random", dtype)
        for prec in ("tf32", "tf32x3", "ieee"):
            for br, bv, nw in [(64, 64, 8), (64, 128, 8), (64, 64, 4), (32, 64, 4), (32, 128, 4), (32, 128, 8), (32, 32, 4), (16, 64, 4), (16, 128, 4)]:
                try:
                    eo, ed, t = variant(args, ro, rf, prec, block_rows=br, block_v=bv, num_warps=nw)
                    p(f"weaver n=128 {dtype:8s} {prec:6s} BR={br:3d} BV={bv:3d} w={nw}: o {eo:.2e} delta {ed:.2e}  {t:8.1f} us")
                except Exception as e:
                    p(f"weaver n=128 {dtype} {prec} BR={br} BV={bv} w={nw}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    traceback.print_exc(file=log)

if mode in ("all", "sizes"):
    cfgs = [dict(block_rows=64, block_v=64, num_warps=8), dict(block_rows=32, block_v=64, num_warps=4)]
    for base, name in ((WEAVER, "weaver"), (SPECLA, "specla")):
        for n, kind in [(16, "random"), (32, "random"), (64, "random"), (128, "random"), (128, "chain"), (256, "mixed")]:
            args, parents, ro, rf = setup(base, n, kind, "bfloat16")
            for prec in ("tf32", "ieee"):
                for cfg in cfgs:
                    try:
                        eo, ed, t = variant(args, ro, rf, prec, **cfg)
                        p(f"{name} n={n:3d} {kind:6s} bf16 {prec:6s} {cfg}: o {eo:.2e} delta {ed:.2e}  {t:8.1f} us")
                    except Exception as e:
                        p(f"{name} n={n} {kind} {prec} {cfg}: FAILED {type(e).__name__}: {str(e)[:300]}")
                        traceback.print_exc(file=log)
            q, k, v, g, beta, s0, anc, scale = args
            if n <= 128:
                st = tree_states_fused(k, v, g, beta, s0, parents.cuda())
                snaps = gdn.tree_gdn(*(x.to(F64) for x in (q, k, v, g, beta, s0)), anc, scale, keep_snapshots=True)[1].snapshots
                es = rel(st, snaps); del snaps
            else:
                es = float("nan")
            t = do_bench(lambda: tree_states_fused(k, v, g, beta, s0, parents.cuda()), warmup=10, rep=50, return_mode="median") * 1e3
            p(f"{name} n={n:3d} {kind:6s} states: err {es:.2e}  {t:8.1f} us  ({n*base['HV']*base['dv']*base['dk']*4/t/1e6:.2f} TB/s written)")
log.close()
