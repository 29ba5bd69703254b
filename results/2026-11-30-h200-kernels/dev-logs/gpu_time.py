"""Graph-timed variants of tree_gdn_fused (scratch)."""
import os, sys, traceback
sys.path.insert(0, "."); sys.path.insert(0, "tests")
import torch, triton
from triton.testing import do_bench
from test_triton_tree import make_inputs, rel, WEAVER, SPECLA
from repro.gdn import reference as gdn
from repro.gdn.triton_tree import tree_gdn_fused, tree_states_fused
from repro.tree import Tree
F64 = torch.float64
log = open(os.path.join(os.environ.get("OUT", "/tmp"), "time.txt"), "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

def setup(base, n, kind, dtype, seed=99):
    spec = {**base, "n": n, "kind": kind, "dtype": dtype, "seed": seed}
    (q, k, v, g, beta), s0, parents = make_inputs(spec, "cuda")
    anc = Tree(torch.zeros(n, dtype=torch.long), parents).ancestor_mask.cuda()
    scale = base["dk"] ** -0.5
    ro, rf = gdn.tree_gdn(*(x.to(F64) for x in (q, k, v, g, beta, s0)), anc, scale)
    return (q, k, v, g, beta, s0, anc, scale), parents, ro, rf

def graph_time(fn, reps=20):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(reps):
            fn()
    return do_bench(gr.replay, warmup=10, rep=60, return_mode="median") * 1e3 / reps

def variant(args, ro, rf, prec, **kw):
    q, k, v, g, beta, s0, anc, scale = args
    n, hv, dv = v.shape
    outs = (torch.empty(n, hv, dv, dtype=q.dtype, device="cuda"), torch.empty(n, hv, dv, device="cuda"), torch.empty(n, hv, device="cuda"))
    fn = lambda: tree_gdn_fused(q, k, v, g, beta, s0, anc, scale, prec, out=outs, **kw)
    o, f = fn(); torch.cuda.synchronize()
    eo, ed = rel(o, ro), rel(f.delta, rf.delta)
    return eo, ed, graph_time(fn)

def sweep(name, base, n, kind, dtype, precs, cfgs):
    args, parents, ro, rf = setup(base, n, kind, dtype)
    for prec in precs:
        for br, bv, nw, b16 in cfgs:
            try:
                eo, ed, t = variant(args, ro, rf, prec, block_rows=br, block_v=bv, num_warps=nw, batched_base=b16)
                p(f"{name} n={n:3d} {kind:6s} {dtype:8s} {prec:6s} BR={br:2d} BV={bv:3d} w={nw} b16={int(b16)}: o {eo:.1e} d {ed:.1e} {t:7.1f} us")
            except Exception as e:
                p(f"{name} n={n} {prec} BR={br} BV={bv} w={nw} b16={b16}: FAILED {type(e).__name__}: {str(e)[:400]}")
                traceback.print_exc(file=log)
    q, k, v, g, beta, s0, anc, scale = args
    par = parents.cuda()
    st = torch.empty(n, *s0.shape, device="cuda")
    for bv in (None, 8, 32):
        t = graph_time(lambda: tree_states_fused(k, v, g, beta, s0, par, out=st, block_v=bv))
        p(f"{name} n={n:3d} states bv={bv}: {t:7.1f} us ({st.numel()*4/t/1e6:.2f} TB/s)")

ALL = [(64, 64, 8, True), (64, 64, 8, False), (64, 128, 8, True), (64, 64, 4, True), (32, 64, 4, True), (32, 64, 4, False), (32, 128, 4, True), (32, 128, 8, True), (16, 64, 4, False), (16, 128, 4, False)]
sweep("weaver", WEAVER, 128, "random", "bfloat16", ["tf32"], ALL)
sweep("weaver", WEAVER, 128, "random", "bfloat16", ["ieee", "tf32x3"], [(64, 64, 8, True), (32, 64, 4, True), (32, 32, 4, True), (16, 64, 4, False)])
for n in (16, 64, 256):
    sweep("weaver", WEAVER, n, "mixed", "bfloat16", ["tf32"], [(64, 64, 8, True), (32, 64, 4, True), (16, 64, 4, False)])
for n in (16, 128):
    sweep("specla", SPECLA, n, "chain", "bfloat16", ["tf32"], [(64, 64, 8, True), (64, 32, 4, True), (32, 64, 4, True), (32, 32, 4, True), (16, 32, 4, False)])
log.close()
