"""GPU check and bench of the tree-verify-fast branch (issue 13 item 1): the blocked tree kernel
(repro.gdn.triton_tree.tree_gdn_blocked: T = (I + A)^-1 explicit, three launches, the value work in
independent programs) beside per-branch recurrence and the fused / split tree kernels.

    python3 scripts/gpu/tree-verify-fast.py OUT_DIR      (one H200: < 90 s)

Environment: TREE_FAST_BUDGET_S (70: rows not started by then are recorded as skipped, and said so),
TREE_FAST_SHAPES (weaver,specla), TREE_FAST_SETTINGS (comma list of SETTINGS names for the sweep;
default: all of them).

Order (the most telling first, so that a spent budget drops the least): both shapes at T = 128 on a draft
tree (repro.bench.shapes.make_tree, depth <= 16): `repro bench kernels` rows (repro.bench.kernels.measure:
float64 check, then do_bench and CUDA-graph medians; floor; bf16 inputs, "tf32" dots) of
per_branch_recurrent, tree_fused, tree_split, tree_blocked; the same at T = 256; then the sweep of
tree_blocked's knobs at T = 128 (each setting checked against the same float64 reference before it is
timed); then T = 64, 32 and a 128-node chain (group "chain": per-branch = fla's recurrence over the one
path).

Writes OUT_DIR/tree-verify-fast.json (ceilings, rows, sweep, targets) and OUT_DIR/tree-verify-fast.md;
prints the markdown. Exit 3 when any row or setting failed its float64 check.
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

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us, measure_ceilings
from repro.gdn import triton_tree as tt

BUDGET_S = float(os.environ.get("TREE_FAST_BUDGET_S", "70"))
RUN_SHAPES = os.environ.get("TREE_FAST_SHAPES", "weaver,specla").split(",")
METHODS = ["per_branch_recurrent", "tree_fused", "tree_split", "tree_blocked"]
SETTINGS: dict[str, dict[str, Any]] = {  # tree_gdn_blocked knobs (module docstring of triton_tree)
    "default": {},  # BR = 64 (tf32), BRV = BC = 32, BV 64 or 32, X0 precomputed in phase 2
    "x0-in-values": dict(precompute_x0=False),  # every value program computes its own K S0^T
    "br32": dict(block_rows=32),  # key blocks of 32: more key programs, NR - 1 = 3 column steps at T=128
    "brv16": dict(block_rows_v=16),  # more value programs
    "bv16": dict(block_v=16),
    "bc64": dict(block_cols=64),
    "bc128-wv8": dict(block_cols=128, num_warps_v=8),  # one column block: one dot over all rows
    "stages-v2": dict(num_stages_v=2),
    "w4": dict(num_warps=4),  # phases 1-2 with 4 warps (default 8 at BR = 64)
    "br32-brv16-bv32": dict(block_rows=32, block_rows_v=16, block_v=32),
}
PICK = os.environ.get("TREE_FAST_SETTINGS")
if PICK:
    SETTINGS = {k: SETTINGS[k] for k in PICK.split(",")}
TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
COLS = ["shape", "kind", "T", "method", "setting", "status", "rel_err", "us_graph", "floor_us",
        "x_floor_graph", "speedup_graph", "reason"]  # fmt: skip


def over(start: float) -> str | None:
    return f"script budget of {BUDGET_S:g} s spent" if time.monotonic() - start > BUDGET_S else None


def row_specs(t: int, kind: str) -> list[bk.RowSpec]:
    group = "chain" if kind == "chain" else "verify"
    return [bk.RowSpec(shape, group, kind, t, m, "bf16") for shape in RUN_SHAPES for m in METHODS]


def sweep(
    shape: str, t: int, cfg: bk.BenchConfig, dev: torch.device, rows: list[dict[str, Any]], start: float
) -> list[dict[str, Any]]:
    """Every setting of tree_gdn_blocked on the block's tree: float64 check, then CUDA-graph median."""
    spec = bk.RowSpec(shape, "verify", "draft", t, "tree_blocked", "bf16")
    case = bk.make_case(spec, cfg, dev)
    seed = km.seed_of(spec, cfg.seed, "sweep")
    x64 = km.make_inputs(case.shape, case.n, seed, dev)
    ref = km.reference("nodes", case, x64)
    nbytes, flops, rate = km.cost("tree_blocked", "bf16", case)
    sets = [x64.to("bf16")] + [
        km.make_inputs(case.shape, case.n, seed + i, dev).to("bf16")
        for i in range(1, bk.graph_sets(dev, nbytes))
    ]
    base = [
        r for r in rows if (r["shape"], r["kind"], r["T"], r["method"]) == (shape, "draft", t, METHODS[0])
    ]
    base_us = base[0]["us_graph"] if base else None
    floor = [r["floor_us"] for r in rows if (r["shape"], r["T"], r["method"]) == (shape, t, "tree_blocked")]
    out = []
    for name, knobs in SETTINGS.items():
        row = dict(shape=shape, kind="draft", T=t, method="tree_blocked", setting=name, status="skipped",
                   rel_err=None, us_graph=None, floor_us=floor[0] if floor else None, reason="")  # fmt: skip
        why = over(start)
        if why:
            row["reason"] = why
            out.append(row)
            continue
        fns = [
            partial(tt.tree_gdn_blocked, x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors,
                    case.shape.scale, "tf32", **knobs)
            for x in sets
        ]  # fmt: skip
        try:
            err = km.rel_err(fns[0]()[0], ref)
            row["rel_err"] = err
            if not err <= km.TOLERANCE["bf16"]:
                row.update(status="FAIL", reason=f"rel err {err:.2e} > tol: not timed")
            else:
                row["us_graph"] = graph_us([lambda f=f: f()[0] for f in fns], dev, TIMER, 20.0)
                row["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one failing setting must not stop the sweep
            row.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        if row["us_graph"] and row["floor_us"]:
            row["x_floor_graph"] = row["us_graph"] / row["floor_us"]
        if row["us_graph"] and base_us:
            row["speedup_graph"] = base_us / row["us_graph"]
        out.append(row)
        print(f"sweep {shape} T={t} {name:18s} {row['status']:7s} us={row['us_graph']} err={row['rel_err']}")
    return out


def bench(
    specs: list[bk.RowSpec], cfg: bk.BenchConfig, dev: torch.device, ceilings: dict[str, Any],
    rows: list[dict[str, Any]], start: float, paper: dict,
) -> None:  # fmt: skip
    for spec in specs:
        row = bk.measure(spec, cfg, dev, ceilings, over(start))
        row["setting"] = "default" if spec.method.startswith("tree_") else ""
        rows.append(row)
        print(f"{spec.shape:7s} {spec.kind:6s} T={spec.T:<4d} {spec.method:22s} {row['status']:7s}"
              f" us_graph={row['us_graph']} err={row['rel_err']} {row['reason']}")  # fmt: skip
    for row in rows:
        bk.derive(row, rows, paper)


def targets(rows: list[dict[str, Any]], swept: list[dict[str, Any]]) -> list[str]:
    """The issue's targets for the best tree_blocked setting measured at each (shape, T)."""
    goals = {("weaver", 128): (15.0, 7.1), ("weaver", 256): (30.0, None), ("specla", 128): (15.0, 3.0)}
    out = []
    for (shape, t), (us_max, x_min) in goals.items():
        cands = [r for r in rows + swept if (r["shape"], r["kind"], r["T"], r["method"]) ==
                 (shape, "draft", t, "tree_blocked") and r.get("us_graph")]  # fmt: skip
        base = [r for r in rows if (r["shape"], r["kind"], r["T"], r["method"]) ==
                (shape, "draft", t, METHODS[0]) and r.get("us_graph")]  # fmt: skip
        if not cands:
            out.append(f"{shape} T={t}: tree_blocked not measured")
            continue
        best = min(cands, key=lambda r: r["us_graph"])
        us = best["us_graph"]
        line = f"{shape} T={t}: best tree_blocked [{best.get('setting')}] {us:.1f} us (target <= {us_max:g}: "
        line += f"{'met' if us <= us_max else 'missed'})"
        if base:
            x = base[0]["us_graph"] / us
            line += f", {x:.2f}x per-branch ({base[0]['us_graph']:.1f} us)"
            if x_min:
                line += f" (target >= {x_min:g}x: {'met' if x >= x_min else 'missed'})"
        out.append(line)
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
    cfg = bk.BenchConfig(timer=TIMER, bf16_precision="tf32")
    ceilings = measure_ceilings(dev, TimerConfig(warmup_ms=1.0, rep_ms=3.0))
    paper = bk.paper_numbers()
    rows: list[dict[str, Any]] = []
    swept: list[dict[str, Any]] = []
    bench(row_specs(128, "draft") + row_specs(256, "draft"), cfg, dev, ceilings, rows, start, paper)
    for shape in RUN_SHAPES:
        swept += sweep(shape, 128, cfg, dev, rows, start)
    later = [s for t in (64, 32) for s in row_specs(t, "draft")] + row_specs(128, "chain")
    bench(later, cfg, dev, ceilings, rows, start, paper)
    goals = targets(rows, swept)
    skipped = sum(r["status"] == "skipped" and "budget" in (r["reason"] or "") for r in rows + swept)
    result = {"device": torch.cuda.get_device_name(), "seconds": time.monotonic() - start,
              "budget_s": BUDGET_S, "skipped_for_budget": skipped, "ceilings": ceilings, "rows": rows,
              "sweep": swept, "settings": SETTINGS, "targets": goals}  # fmt: skip
    (out_dir / "tree-verify-fast.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [f"# tree-verify-fast on {result['device']} ({result['seconds']:.0f} s)", ""]
    if skipped:
        lines += [f"**{skipped} rows/settings skipped: the {BUDGET_S:g} s budget was spent** "
                  "(TREE_FAST_BUDGET_S, TREE_FAST_SHAPES, TREE_FAST_SETTINGS pick fewer).", ""]  # fmt: skip
    lines += ["## Targets", ""] + [f"- {g}" for g in goals]
    head = (
        "## Rows (us_graph: CUDA-graph median per layer call, bf16 inputs, tf32 dots; speedup vs per-branch)"
    )
    lines += ["", head, "", "| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in COLS) + " |" for r in rows]
    lines += ["", "## tree_blocked settings at T = 128 (draft tree)", ""]
    lines += ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in COLS) + " |" for r in swept]
    lines += ["", "settings: " + "; ".join(f"{k} = {v or 'defaults'}" for k, v in SETTINGS.items())]
    text = "\n".join(lines) + "\n"
    (out_dir / "tree-verify-fast.md").write_text(text)
    print(text)
    bad = [r for r in rows + swept if r["status"] in ("FAIL", "error")]
    sys.exit(3 if bad else 0)


if __name__ == "__main__":
    main()
