import os, sys
sys.path.insert(0, "."); sys.path.insert(0, "tests")
import torch
sys.argv = [sys.argv[0]]
exec(open(".device/ttree/gpu_time.py").read().split("ALL = [")[0])
def dflt(name, base, n, kind, dtype, precs):
    args, parents, ro, rf = setup(base, n, kind, dtype)
    for prec in precs:
        eo, ed, t = variant(args, ro, rf, prec)
        p(f"{name} n={n:3d} {kind:6s} {dtype:8s} {prec:6s} defaults: o {eo:.1e} d {ed:.1e} {t:7.1f} us")
    q, k, v, g, beta, s0, anc, scale = args
    par = parents.cuda(); st = torch.empty(n, *s0.shape, device="cuda")
    t = graph_time(lambda: tree_states_fused(k, v, g, beta, s0, par, out=st))
    p(f"{name} n={n:3d} states defaults: {t:7.1f} us ({st.numel()*4/t/1e6:.2f} TB/s)")
for n in (16, 32, 64, 128, 256):
    dflt("weaver", WEAVER, n, "random", "bfloat16", ["tf32", "tf32x3", "ieee"])
dflt("weaver", WEAVER, 128, "random", "float32", ["tf32", "tf32x3", "ieee"])
for n, kind in ((16, "chain"), (64, "chain"), (128, "chain"), (128, "random")):
    dflt("specla", SPECLA, n, kind, "bfloat16", ["tf32", "ieee"])
