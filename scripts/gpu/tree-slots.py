"""Row blocks of the split tree kernel at the engine's slot sizes (issue 13 item 1, issues 10's verify).

    python3 scripts/gpu/tree-slots.py OUT_DIR      (one H200: ~2-3 min; TREE_SLOTS_BUDGET seconds, 240)

The static decoder verifies a root and a budget of 2^k nodes on slots of 2^k + 1 rows, and a slot one row
past a multiple of the row block pays a whole block more (Weaver's shape: 37.3 us at 65 nodes against 17.7
at 64). For each GDN layer shape (Weaver = Qwen3.6-27B, SpecLA = GDN-1.3B, the tiny family's) and tree
size in TREE_SLOTS_SIZES (default 32,33,64,65,128,129): the fused kernel (its default tiles, and over
32-row blocks, ``fused-br32``: at 64-row blocks it spills registers, scripts/sm90_resources.py), the split
form's default tiles (:func:`repro.gdn.triton_tree.split_tiles`), the split form with node 0 peeled (``peel``:
the tiles of n - 1 rows) and over row blocks of 16 / 32 / 64 with each phase-2 walk (registers only up to four
blocks), bf16 inputs, "tf32" dots, a draft tree of the bench.
Every variant is checked against the fused kernel's output (relative error < 1e-2) before it is timed
(CUDA-graph median per call). TREE_SLOTS_VARIANTS (comma-separated names, e.g. fused,split-default,split-peel)
keeps only those. Writes OUT_DIR/tree-slots.json and .md after every shape.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _triton_resources import tree_resources  # this script's folder is first on sys.path

from repro.bench import kernel_methods as km
from repro.bench import kernels as bk
from repro.bench.timing import TimerConfig, graph_us
from repro.gdn import triton_tree as tt

TIMER = TimerConfig(warmup_ms=1.0, rep_ms=5.0, graph_replays=3)
PREC = "tf32"


def variants(n: int) -> dict[str, dict[str, Any]]:
    """The split form's options timed at ``n`` nodes: default tiles, then every (row block, walk)."""
    out: dict[str, dict[str, Any]] = {"split-default": {}}
    if n >= 17:
        out["split-peel"] = dict(peel=True)  # node 0 before the row blocks: the tiles of n - 1 rows
    for br in (16, 32, 64):
        blocks = -(-n // br)
        if br >= 2 * n or blocks > 16:
            continue
        for walk in tt.WALKS:
            if walk == "registers" and blocks > 4:
                continue
            out[f"split-br{br}-{walk}"] = dict(block_rows=br, walk=walk)
    return out


def shape_rows(shape: str, n: int, dev: torch.device) -> list[dict[str, Any]]:
    spec = bk.RowSpec(shape, "verify", "draft", n, "tree_split", "bf16")
    case = bk.make_case(spec, bk.BenchConfig(timer=TIMER, bf16_precision=PREC), dev)
    x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "slots"), dev).to("bf16")
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.tree_mask, case.shape.scale, PREC)
    ref = tt.tree_gdn_fused(*args)[0].float()
    default = tt.split_tiles(n, case.shape.hv, case.shape.dv, PREC)
    calls = {"fused": lambda: tt.tree_gdn_fused(*args)}
    if n > 32:
        calls["fused-br32"] = lambda: tt.tree_gdn_fused(*args, block_rows=32)
    calls |= {name: (lambda kw=kw: tt.tree_gdn_split(*args, **kw)) for name, kw in variants(n).items()}
    picked = os.environ.get("TREE_SLOTS_VARIANTS")
    if picked:
        calls = {name: fn for name, fn in calls.items() if name in picked.split(",")}
    rows = []
    for name, fn in calls.items():
        r: dict[str, Any] = dict(shape=shape, T=n, variant=name)
        if name == "split-default":
            r["block_rows"], r["block_v"] = default
        try:
            err = ((fn()[0].float() - ref).norm() / ref.norm()).item()
            r["rel_err_vs_fused"] = err
            if err >= 1e-2:
                r["status"] = "FAIL"
            else:
                r["us"], r["status"] = graph_us([fn], dev, TIMER, 30.0), "ok"
        except Exception as exc:  # noqa: BLE001 - one variant must not stop the rest
            r.update(status="error", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        print(f"{shape:12s} T={n:<4d} {name:22s} {r.get('status')} us={r.get('us')}", flush=True)
        rows.append(r)
    return rows


def dump(out_dir: Path, rows: list[dict[str, Any]], start: float) -> str:
    """Write the JSON and the markdown of the rows so far; each (shape, T)'s fastest variant in bold."""
    result = {"device": torch.cuda.get_device_name(), "seconds": time.monotonic() - start, "rows": rows}
    (out_dir / "tree-slots.json").write_text(json.dumps(result, indent=1, default=str))
    best: dict[tuple[str, int], float] = {}
    for r in rows:
        if r.get("us") is not None:
            key = (r["shape"], r["T"])
            best[key] = min(best.get(key, float("inf")), r["us"])
    cols = ["shape", "T", "variant", "block_rows", "status", "us", "rel_err_vs_fused"]
    lines = [f"# tree-slots on {result['device']} ({result['seconds']:.0f} s)", "",
             "CUDA-graph medians per layer call (bf16 inputs, tf32 dots), each checked against the fused "
             "output first; fastest per (shape, T) in bold.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]  # fmt: skip
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, r.get("reason") if c == "status" else None)
            text = f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))
            cells.append(f"**{text}**" if c == "us" and v == best.get((r["shape"], r["T"])) else text)
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out_dir / "tree-slots.md").write_text(text)
    return text


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in os.environ.get("TREE_SLOTS_SIZES", "32,33,64,65,128,129").split(",")]
    shapes = os.environ.get("TREE_SLOTS_SHAPES", "weaver,specla,tiny-qwen35").split(",")
    budget = float(os.environ.get("TREE_SLOTS_BUDGET", "240"))
    start, rows, dev = time.monotonic(), [], torch.device("cuda")
    for shape in shapes:
        for n in sizes:
            if time.monotonic() - start > budget:
                print(f"budget spent: {shape} T={n} skipped")
                continue
            rows += shape_rows(shape, n, dev)
            dump(out_dir, rows, start)
    print(dump(out_dir, rows, start))
    tree_resources(out_dir)


if __name__ == "__main__":
    main()
