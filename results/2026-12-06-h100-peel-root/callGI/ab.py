import importlib.util, json, sys
from pathlib import Path
import torch
from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as now

spec_ = importlib.util.spec_from_file_location("tt_before", "tt_before.py")
before = importlib.util.module_from_spec(spec_); sys.modules["tt_before"] = before; spec_.loader.exec_module(before)
TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
dev = torch.device("cuda"); rows = []
for shape in ("weaver", "specla", "tiny-qwen35"):
    for t in (33, 65, 128, 129):
        spec = bk.RowSpec(shape, "verify", "draft", t, "tree_split", "bf16")
        case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision="tf32"), dev)
        x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "gates"), dev).to("bf16")
        args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, case.shape.scale, "tf32")
        ref = before.tree_gdn_fused(*args)[0].float()
        for src, tt in (("before", before), ("now", now)):
            for form, fn in (("fused", lambda tt=tt: tt.tree_gdn_fused(*args)),
                             ("split", lambda tt=tt: tt.tree_gdn_split(*args)),
                             ("split-peel", lambda tt=tt: tt.tree_gdn_split(*args, peel=True))):
                r = dict(shape=shape, T=t, source=src, form=form)
                try:
                    o = fn()[0].float()
                    r["err"] = ((o - ref).norm() / ref.norm()).item()
                    r["us"] = graph_us([fn], dev, TIMER, 40.0)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(r)
                print(f"{shape:11s} T={t:<4d} {src:6s} {form:10s} err={r.get('err', float('nan')):.2e} us={r.get('us', float('nan')):.2f}", flush=True)
res = []
for name, tt in (("before", before), ("now", now)):
    for fn in (tt._tree_keys_kernel, tt._tree_verify_kernel):
        for kc, *_ in fn.device_caches.values():
            for k in kc.values():
                k._init_handles()
                c = {fn.arg_names[i[0]]: v for i, v in k.src.constants.items() if len(i) == 1}
                res.append(dict(source=name, kernel=k.name, BR=c.get("BR"), DK=c.get("DK"), NPG=c.get("NPG"),
                                PEEL=c.get("PEEL"), n_regs=k.n_regs, n_spills=k.n_spills))
for r in res: print(r)
Path(sys.argv[1], "ab.json").write_text(json.dumps({"rows": rows, "resources": res}, indent=1))
