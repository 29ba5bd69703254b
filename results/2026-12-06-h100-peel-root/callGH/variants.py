import importlib.util, json, sys, re
from pathlib import Path
import torch
from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as tt0

SRC = Path(tt0.__file__).read_text()
GATES_OLD = '''    cols = OFF + tl.arange(0, NPG)'''
GATES_ADD = '''    if OFF:
        b_g0 = tl.load(g_ptr + i_h).to(tl.float32)
        b_gr += tl.where(_first_node_column(anc_ptr, rows, n, CHAIN), b_g0, 0.0)
'''
COLS_CALL = re.search(r"    if PEEL and pid >= NR \* NR:\n(.*\n)*?        return\n", SRC).group(0)
NPG_HOST = "NPG=_pow2_at_least(c.n - peel)"
VARIANTS = {
    "current": [],
    "gates-from-0": [(GATES_OLD, "    cols = tl.arange(0, NPG)"), (GATES_ADD, ""), (NPG_HOST, "NPG=_pow2_at_least(c.n)")],
    "no-node0-add(wrong)": [(GATES_ADD, "")],
    "no-col-branch(wrong)": [(COLS_CALL, ""), ("nr * (peel and node0_programs)", "0")],
    "gates-after-loop": None,  # filled below
}
# b_gr / b_gc computed after the d_k loop (their [BR, NPG] tiles not live across the dots)
main_gates = "    b_gr = _block_gates(g_ptr, anc_ptr, r, n, i_h, HV, BR, CHAIN, NPG, PEEL)\n    b_gc = _block_gates(g_ptr, anc_ptr, c, n, i_h, HV, BR, CHAIN, NPG, PEEL)\n"
assert SRC.count(main_gates) == 1
after = "    m_rc = _block_mask(anc_ptr, rows, cols, n, CHAIN)\n    b_gam = tl.where(m_rc, tl.exp(tl.where(m_rc, b_gr[:, None] - b_gc[None, :], 0.0)), 0.0)\n    b_beta = tl.load(beta_ptr + rows * HV + i_h, mask=m_rows, other=0.0).to(tl.float32)\n    b_a = tl.where(rows[:, None] > cols[None, :], b_beta[:, None] * b_kk * b_gam, 0.0)\n    p_blk"
assert SRC.count(after) == 1, "after"
VARIANTS["gates-after-loop"] = [(main_gates, ""), (after, main_gates + after)]

def load(name, patches):
    src = SRC
    for a, b in patches:
        assert src.count(a) == 1, (name, a[:50])
        src = src.replace(a, b)
    path = Path(sys.argv[1]) / f"tt_{re.sub(r'[^a-z0-9]', '_', name)}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec); sys.modules[path.stem] = mod; spec.loader.exec_module(mod)
    return mod

TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
dev = torch.device("cuda"); rows = []
cases = [("weaver", 129), ("weaver", 128), ("weaver", 65), ("tiny-qwen35", 129), ("specla", 129)]
for name, patches in VARIANTS.items():
    try:
        tt = load(name, patches)
    except Exception as e:
        print(name, "patch/import failed", e); continue
    for shape, t in cases:
        spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
        case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision="tf32"), dev)
        x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "peel"), dev).to("bf16")
        args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, case.shape.scale, "tf32")
        ref = tt0.tree_gdn_fused(*args)[0].float()
        r = dict(variant=name, shape=shape, T=t)
        try:
            o = tt.tree_gdn_split(*args, peel=True)[0].float()
            r["err"] = ((o - ref).norm() / ref.norm()).item()
            r["us"] = graph_us([lambda: tt.tree_gdn_split(*args, peel=True)], dev, TIMER, 40.0)
            base = graph_us([lambda: tt0.tree_gdn_split(*args)], dev, TIMER, 40.0)
            r["unpeeled_us"] = base
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for kc, *_ in tt._tree_keys_kernel.device_caches.values():
            for k in kc.values():
                k._init_handles()
                const = {tt._tree_keys_kernel.arg_names[i[0]]: v for i, v in k.src.constants.items() if len(i) == 1}
                if const.get("DK") == case.shape.dk and const.get("PEEL") == 1:
                    r.setdefault("keys", []).append((const["BR"], const["NPG"], k.n_regs, k.n_spills))
        rows.append(r); print(json.dumps(r), flush=True)
Path(sys.argv[1], "variants.json").write_text(json.dumps(rows, indent=1))
