"""GPU check and bench of the dev-hybrid branch (issue 13 item 2): SpecLA's hybrid schedule
(repro.gdn.hybrid_schedule: main chain + masked remainder forest) beside the tree kernels.

    python3 scripts/gpu/dev-hybrid.py OUT_DIR      (one H200: < 90 s)

Environment: DEV_HYBRID_BUDGET_S (60: rows not started by then are recorded as skipped).

`repro bench kernels` verify rows (repro.bench.kernels.measure: each checked against float64 before it
is timed; CUDA-graph medians; floor, x_floor, speedup over per_branch_recurrent): per_branch_recurrent,
tree_fused, tree_split and hybrid (bf16 inputs, tf32 dots) on draft trees at T = 16, 32, 64, 128 at both
paper shapes (SpecLA first), plus hybrid in float32 ("ieee") for exactness; each row notes the tree's
decomposition (main chain m, remainder r). Writes OUT_DIR/dev-hybrid.json and OUT_DIR/dev-hybrid.md;
prints the markdown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.shapes import SHAPES
from repro.bench.timing import TimerConfig, measure_ceilings
from repro.gdn import hybrid_schedule as hs

BUDGET_S = float(os.environ.get("DEV_HYBRID_BUDGET_S", "60"))
SIZES = [16, 32, 64, 128]
METHODS = [("per_branch_recurrent", "bf16"), ("tree_fused", "bf16"), ("tree_split", "bf16"),
           ("hybrid", "bf16"), ("hybrid", "fp32")]  # fmt: skip
TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
COLS = ["shape", "T", "method", "dtype", "status", "rel_err", "us_graph", "floor_us", "x_floor_graph",
        "speedup_graph", "reason"]  # fmt: skip


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")  # CPU: a smoke run of the plumbing (rows skipped)
    cfg = bk.BenchConfig(timer=TIMER)
    ceilings = measure_ceilings(dev, cfg.timer, quick=not cuda)
    paper = bk.paper_numbers()
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    for shape in ("specla", "weaver") if cuda else ("specla",):
        for t in SIZES if cuda else SIZES[:1]:
            for method, dtype in METHODS:
                spec = bk.RowSpec(shape, "verify", "draft", t, method, dtype)
                over = time.monotonic() - start > BUDGET_S
                row = bk.measure(
                    spec, cfg, dev, ceilings, f"budget of {BUDGET_S:g} s spent" if over else None
                )
                bk.derive(row, rows + [row], paper)
                if method == "hybrid":
                    plan = hs.plan_hybrid(bk.make_case(spec, cfg, dev).parents)
                    kern = hs.default_kernel(SHAPES[shape].hv, dev, km.DTYPES[dtype])
                    row["reason"] = f"m={plan.chain.numel()} r={plan.rest.numel()} {kern}; " + row["reason"]
                rows.append(row)
                print({c: row.get(c) for c in COLS})
    lines = [
        "# dev-hybrid: SpecLA's hybrid schedule vs the tree kernels (verify group, draft trees)",
        "",
        f"device: {torch.cuda.get_device_name(dev) if cuda else 'cpu'}; CUDA-graph medians (us); "
        "x_floor_graph = us_graph / floor_us",
        "",
        "| " + " | ".join(COLS) + " |",
        "|" + "---|" * len(COLS),
    ]
    for r in rows:
        cells = [f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c)) for c in COLS]
        lines.append("| " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    (out_dir / "dev-hybrid.md").write_text(md)
    (out_dir / "dev-hybrid.json").write_text(
        json.dumps({"ceilings": ceilings, "rows": rows}, indent=1, default=str)
    )
    print(md)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out-dev-hybrid"))
