"""GPU check and bench of the dev-kernels13 branch (issue 13): the path commit on many small state tiles
(repro.gdn.triton_commit.commit_path_fused) and the chain verifier (repro.gdn.chain.verify_chain).

    python3 scripts/gpu/dev-kernels13.py OUT_DIR      (one H200: < 90 s)

Environment: DEV_KERNELS13_BUDGET_S (60: rows not started by then are recorded as skipped),
DEV_KERNELS13_PARTS (checks,sweep,recovery,chain), DEV_KERNELS13_SHAPES (specla,weaver).

1. checks vs float64: commit_path_fused at its default settings and every other one the sweep times
   (the earlier kernel's, broadcast products, wide tiles) at both paper shapes, a 128-node draft tree,
   several path ends and node -1 (state error; conv history exact);
2. a sweep of the commit's settings (CUDA-graph medians over 16 input sets, random factors: the values do
   not change the time) at depths 4 and 16, both shapes;
3. `repro bench kernels` rows (repro.bench.kernels.measure: each checked against float64 before it is
   timed; CUDA-graph medians; floor, x_floor): recovery at depths 1, 2, 4, 8, 16 on a 128-node draft tree
   (token replay through fla, the earlier path commit, the new one, the new one with the conv commit)
   at SpecLA's shape; the chain group at T = 16..256 (per-branch recurrent, fla's chunk kernel, both tree
   kernels, the chain verifier) at both shapes; then the recovery rows at Weaver's shape.

Writes OUT_DIR/dev-kernels13.json (checks, sweep, rows, targets, the chain table the numbers imply) and
OUT_DIR/dev-kernels13.md; prints the markdown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from repro.bench import kernels as bk
from repro.bench.shapes import SHAPES, deepest_path, make_tree
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings
from repro.gdn import chain
from repro.gdn import reference as gdn
from repro.gdn import triton_commit as tc
from repro.tree import Tree

BUDGET_S = float(os.environ.get("DEV_KERNELS13_BUDGET_S", "60"))  # rows not started by then: skipped
# which parts run (a second call can take the rest): checks, sweep, recovery, chain; and which shapes
PARTS = os.environ.get("DEV_KERNELS13_PARTS", "checks,sweep,recovery,chain").split(",")
RUN_SHAPES = os.environ.get("DEV_KERNELS13_SHAPES", "specla,weaver").split(",")
DEPTHS = [1, 2, 4, 8, 16]
RECOVERY = ["commit_replay_fla", "commit_path_fused_old", "commit_path_fused", "commit_path_fused_conv"]
CHAIN = [m for m, _ in bk.CHAIN_ROWS if m != "chain_torch"]  # the torch reference is not graph-timed
CANDIDATES = {  # chain row method -> repro.gdn.chain method
    "per_branch_recurrent": "recurrent",
    "chain_chunk": "chunk",
    "tree_fused": "tree_fused",
    "tree_split": "tree_split",
}
SETTINGS: dict[str, dict[str, Any]] = {  # commit_path_fused settings checked and swept
    "default": {},  # 16 x 64 tiles, 4 warps, exact dot, first block peeled
    "old": dict(tc.OLD_PATH_TILES),
    "16x64-w2": dict(num_warps=2),
    "32x64-peel": dict(block_v=32),
    "products-8x64-bm8-w2": dict(block_v=8, block_m=8, dot=False, num_warps=2),
    "products-8x64": dict(block_v=8, dot=False),
    "products-4x128-bm8": dict(block_v=4, block_k=128, block_m=8, dot=False),
}
TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
COLS = ["shape", "group", "T", "depth", "method", "status", "rel_err", "us_graph", "floor_us",
        "x_floor_graph", "speedup_graph", "reason"]  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()) if bool(torch.isfinite(a).all()) else float("inf")


def recovery_tree(n: int = 128) -> Tree:
    return Tree(torch.zeros(n, dtype=torch.long), torch.tensor(make_tree("draft", n, 3)))


def checks(dev: str) -> list[dict[str, Any]]:
    """commit_path_fused at every setting vs the float64 closed form (itself pinned to replay); the conv
    history at the default setting (its programs do not depend on the state tiles)."""
    out = []
    for shape in RUN_SHAPES:
        sh, n = SHAPES[shape], 128
        tree = recovery_tree(n)
        anc = tree.ancestor_mask.to(dev)
        gen = torch.Generator().manual_seed(1)
        f = gdn.TreeFactors(
            delta=torch.randn(n, sh.hv, sh.dv, generator=gen, dtype=torch.float64).float().double(),
            gate_cum=(-torch.rand(n, sh.hv, generator=gen, dtype=torch.float64) * 3).float().double(),
            k=torch.randn(n, sh.hv, sh.dk, generator=gen, dtype=torch.float64).float().double(),
            v=torch.empty(0), g=torch.empty(0), beta=torch.empty(0),
        )  # fmt: skip
        s0 = torch.randn(sh.hv, sh.dv, sh.dk, generator=gen).to(dev)
        c = 2 * sh.h * sh.dk + sh.hv * sh.dv
        hist, xin = torch.randn(3, c, device=dev), torch.randn(n, c, device=dev)
        index = gdn.conv_gather_index(tree.parents, 4).to(dev)
        depth = tree.depth.tolist()
        deepest = max(range(n), key=lambda i: depth[i])
        ends = [-1, 0, deepest, n - 1]
        ops = tuple(x.to(dev, torch.float32) for x in (f.delta, f.k, f.gate_cum))
        for name, kw in SETTINGS.items():
            worst, conv_bad = 0.0, 0
            for end in ends:
                path = tree.path_to(end) if end >= 0 else []
                ref = gdn.commit_closed_form(s0.double().cpu(), f, path)
                got, h = s0.clone(), hist.clone()
                conv = (h, xin, index) if name == "default" else None
                tc.commit_path_fused(got, *ops, anc, torch.tensor([end], device=dev), conv=conv, **kw)
                worst = max(worst, rel(got.cpu(), ref))
                if conv is not None:
                    conv_bad += int((h != gdn.conv_history_after(hist, xin, path)).sum())
            ok = worst <= 1e-6 and conv_bad == 0
            out.append(dict(check=f"commit_path_fused[{name}]", shape=shape, n=n, depth=depth[deepest],
                            state_err=worst, conv_mismatches=conv_bad, ok=ok))  # fmt: skip
            print(out[-1])
    return out


def sweep(dev: torch.device) -> list[dict[str, Any]]:
    """CUDA-graph us of every setting at depths 4 and 16 (16 input sets, random factors)."""
    out = []
    for shape in RUN_SHAPES:
        sh, n = SHAPES[shape], 128
        tree = recovery_tree(n)
        anc = tree.ancestor_mask.to(dev)
        sets = [
            (torch.randn(sh.hv, sh.dv, sh.dk, device=dev), torch.randn(n, sh.hv, sh.dv, device=dev),
             torch.randn(n, sh.hv, sh.dk, device=dev), -torch.rand(n, sh.hv, device=dev))
            for _ in range(bk.MAX_GRAPH_SETS)
        ]  # fmt: skip
        for d in (4, 16):
            node = torch.tensor([deepest_path(tree.parents.tolist(), d)[-1]], device=dev)
            for name, kw in SETTINGS.items():
                fns = [partial(tc.commit_path_fused, *ops, anc, node, **kw) for ops in sets]
                try:
                    us = graph_us(fns, dev, TIMER, 5.0)
                except Exception as exc:  # noqa: BLE001 - one failing setting must not stop the sweep
                    us = None
                    print(f"sweep {shape} d={d} {name}: {type(exc).__name__}: {exc}")
                out.append(dict(shape=shape, depth=d, setting=name, us_graph=us))
                print(out[-1])
    return out


def bench_rows(dev: torch.device, start: float) -> list[dict[str, Any]]:
    cfg = bk.BenchConfig(timer=TIMER, depths=DEPTHS)
    ceilings = measure_ceilings(dev, cfg.timer)
    specs = []  # most telling first: SpecLA's recovery, both shapes' chains, then Weaver's recovery
    recovery = {shape: [bk.RowSpec(shape, "recovery", "draft", 128, m, "bf16" if "fla" in m else "fp32", d)
                        for d in DEPTHS for m in RECOVERY] for shape in RUN_SHAPES}  # fmt: skip
    chains = {shape: [bk.RowSpec(shape, "chain", "chain", t, m, "bf16")
                      for t in bk.CHAIN_SIZES for m in CHAIN] for shape in RUN_SHAPES}  # fmt: skip
    if "recovery" in PARTS:
        specs += recovery.pop("specla", [])
    if "chain" in PARTS:
        specs += [spec for rows in chains.values() for spec in rows]
    if "recovery" in PARTS:
        specs += [spec for rows in recovery.values() for spec in rows]
    paper = bk.paper_numbers()
    rows: list[dict[str, Any]] = []
    for spec in specs:
        over = time.monotonic() - start > BUDGET_S
        row = bk.measure(spec, cfg, dev, ceilings, f"script budget of {BUDGET_S:g} s spent" if over else None)
        bk.derive(row, rows + [row], paper)
        if spec.method == "chain_verify":
            sh = SHAPES[spec.shape]
            row["reason"] = (
                f"chose {chain.chain_method(spec.T, sh.hv, dev, torch.bfloat16)}; " + row["reason"]
            )
        rows.append(row)
        print(f"{spec.shape:7s} {spec.group:8s} T={spec.T} d={row['depth']} {spec.method:24s}"
              f" {row['status']:7s} us_graph={row['us_graph']} err={row['rel_err']}")  # fmt: skip
    return rows


def implied_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape and length the fastest candidate (us_graph), and the CHAIN_CHOICE rows that implies."""
    best: dict[str, dict[int, str]] = {}
    for r in rows:
        if r["group"] != "chain" or r["method"] not in CANDIDATES or r["us_graph"] is None:
            continue
        cur = best.setdefault(r["shape"], {})
        rivals = [
            o for o in rows if o["shape"] == r["shape"] and o["T"] == r["T"] and o["method"] in CANDIDATES
        ]
        fastest = min((o for o in rivals if o["us_graph"] is not None), key=lambda o: o["us_graph"])
        cur[r["T"]] = CANDIDATES[fastest["method"]]
    table = {}
    for shape, per_t in best.items():
        runs: list[list[Any]] = []
        for t in sorted(per_t):
            if runs and runs[-1][1] == per_t[t]:
                runs[-1][0] = t
            else:
                runs.append([t, per_t[t]])
        if runs:
            runs[-1][0] = None
        table[chain.head_class(SHAPES[shape].hv)] = {"shape": shape, "fastest": per_t, "rows": runs}
    return table


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's two targets, read off the rows."""
    out = []

    def us(shape: str, group: str, method: str, key: str, val: int) -> float | None:
        hit = [
            r for r in rows if (r["shape"], r["group"], r["method"], r[key]) == (shape, group, method, val)
        ]
        return hit[0]["us_graph"] if hit else None

    for shape in RUN_SHAPES:
        pairs = [(d, us(shape, "recovery", "commit_path_fused", "depth", d),
                  us(shape, "recovery", "commit_replay_fla", "depth", d)) for d in DEPTHS]  # fmt: skip
        got = [(d, a, b) for d, a, b in pairs if a is not None and b is not None]
        ok = bool(got) and all(a < b for _, a, b in got)
        out.append(f"{shape}: path commit < token replay at depths {[d for d, *_ in got]}: {ok} "
                   + ", ".join(f"d={d} {b / a:.2f}x" for d, a, b in got))  # fmt: skip
        lens = [(t, us(shape, "chain", "chain_verify", "T", t), us(shape, "chain", "chain_chunk", "T", t))
                for t in bk.CHAIN_SIZES]  # fmt: skip
        got = [(t, a, b) for t, a, b in lens if a is not None and b is not None]
        ok = bool(got) and all(a <= b * 1.02 for _, a, b in got)  # 2%: timing noise between equal kernels
        out.append(f"{shape}: chain verifier <= fla chunk at T {[t for t, *_ in got]}: {ok} "
                   + ", ".join(f"T={t} {a:.1f}/{b:.1f}" for t, a, b in got))  # fmt: skip
        a, b = (
            us(shape, "chain", "chain_verify", "T", 16),
            us(shape, "chain", "per_branch_recurrent", "T", 16),
        )
        if a is not None and b is not None:
            out.append(
                f"{shape}: chain verifier <= per-branch recurrent at T=16: {a <= b * 1.02} ({a:.1f}/{b:.1f})"
            )
    return out


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    dev = torch.device("cuda")
    checked = checks("cuda") if "checks" in PARTS else []
    swept = sweep(dev) if "sweep" in PARTS else []
    rows = bench_rows(dev, start)
    table = implied_table(rows)
    goals = targets(rows)
    result = {"device": torch.cuda.get_device_name(), "seconds": time.monotonic() - start, "checks": checked,
              "sweep": swept, "rows": rows, "targets": goals, "measured_choice": table,
              "chain_choice_in_code": chain.CHAIN_CHOICE}  # fmt: skip
    (out_dir / "dev-kernels13.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [f"# dev-kernels13 on {result['device']} ({result['seconds']:.0f} s)", "", "## Targets", ""]
    lines += [f"- {g}" for g in goals]
    lines += ["", "## Checks vs float64", ""]
    lines += ["- " + ", ".join(f"{k}={fmt(v)}" for k, v in c.items()) for c in checked]
    lines += ["", "## Commit settings (us, CUDA graph)", ""]
    lines += ["| shape | depth | " + " | ".join(SETTINGS) + " |", "|---|---|" + "---|" * len(SETTINGS)]
    for shape in RUN_SHAPES:
        for d in (4, 16):
            vals = {s["setting"]: s["us_graph"] for s in swept if s["shape"] == shape and s["depth"] == d}
            lines.append(f"| {shape} | {d} | " + " | ".join(fmt(vals.get(k)) for k in SETTINGS) + " |")
    lines += ["", "## Chain table the numbers imply (repro.gdn.chain.CHAIN_CHOICE rows)", ""]
    for cls, t in table.items():
        rows_txt = ", ".join(f"({a}, {b!r})" for a, b in t["rows"])
        lines.append(f"- {cls!r} ({t['shape']}): ({rows_txt},)  fastest per T: {t['fastest']}")
    lines.append(f"- in the code now: {chain.CHAIN_CHOICE}")
    head = "## Rows (us_graph: CUDA-graph median per layer call; speedup_graph: vs the group's baseline)"
    lines += ["", head, "", "| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in COLS) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    (out_dir / "dev-kernels13.md").write_text(text)
    print(text)
    bad = [c for c in checked if not c["ok"]] + [r for r in rows if r["status"] in ("FAIL", "error")]
    sys.exit(3 if bad else 0)


if __name__ == "__main__":
    main()
