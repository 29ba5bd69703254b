"""Tile sweep of the fused tree-verification kernel on CUDA (device machine; no CPU use).

For each paper layer shape (repro.bench.shapes.SHAPES) and tree size, every (block_rows, block_v,
num_warps) in the grid below runs `tree_gdn_fused` ("tf32", bf16 q/k/v, a best-first draft tree) as
CUDA-graph replays over 4 input sets (repro.bench.timing.graph_us), after checking its o and delta
against the float64 reference (`tree_gdn`) on the same inputs. Writes tune.csv, tune.md (the best
tiles per shape and size beside the default's) and manifest.json under the folder given (default
runs/tune-tree).

    python3 scripts/tune_tree_kernel.py [out_dir] [--sizes 64,128] [--shapes specla,weaver]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.bench.kernel_methods import make_inputs  # noqa: E402
from repro.bench.shapes import SHAPES, draft_tree  # noqa: E402
from repro.bench.timing import TimerConfig, graph_us, median_us  # noqa: E402
from repro.gdn import reference as gdn  # noqa: E402
from repro.gdn import triton_tree  # noqa: E402
from repro.reporting.records import build_manifest  # noqa: E402
from repro.reporting.report import markdown_table  # noqa: E402
from repro.tree import Tree  # noqa: E402

BLOCK_ROWS = (16, 32, 64)
BLOCK_V = (16, 32, 64, 128)
WARPS = (4, 8)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="runs/tune-tree")
    parser.add_argument("--sizes", default="64,128")
    parser.add_argument("--shapes", default="specla,weaver")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    timer = TimerConfig(warmup_ms=5, rep_ms=20, graph_replays=5)
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    config = {"sizes": sizes, "shapes": shapes, "block_rows": BLOCK_ROWS, "block_v": BLOCK_V,
              "num_warps": WARPS, "precision": "tf32", "dtype": "bfloat16", "seed": args.seed,
              "tree": "draft_tree(n, seed)", "timer": "graph_us, 4 input sets"}  # fmt: skip
    rows = []
    for shape_name, n in itertools.product(shapes, sizes):
        shape = SHAPES[shape_name]
        parents = torch.tensor(draft_tree(n, args.seed))
        anc = Tree(torch.zeros(n, dtype=torch.long), parents).ancestor_mask.to(dev)
        sets = [make_inputs(shape, n, args.seed + i, dev) for i in range(4)]
        x0 = sets[0]
        ref_o, ref_f = gdn.tree_gdn(x0.q, x0.k, x0.v, x0.g, x0.beta, x0.state, anc, shape.scale)
        bf = [s.to(torch.bfloat16) for s in sets]
        default = triton_tree.default_tiles(n, shape.hv, shape.dv, "tf32")
        for br, bv, warps in itertools.product(BLOCK_ROWS, BLOCK_V, WARPS):
            if bv > shape.dv or br > max(16, 1 << (n - 1).bit_length()):
                continue
            kw = dict(precision="tf32", block_rows=br, block_v=bv, num_warps=warps)
            row = {"shape": shape_name, "n": n, "block_rows": br, "block_v": bv, "num_warps": warps,
                   "programs": shape.hv * (shape.dv // bv),
                   "default": (br, bv, warps) == default}  # fmt: skip
            t0 = time.perf_counter()
            try:
                o, f = triton_tree.tree_gdn_fused(
                    bf[0].q, bf[0].k, bf[0].v, bf[0].g, bf[0].beta, bf[0].state, anc, shape.scale, **kw
                )
                row["err_o"], row["err_delta"] = rel(o, ref_o), rel(f.delta, ref_f.delta)
                fns = [partial(triton_tree.tree_gdn_fused, x.q, x.k, x.v, x.g, x.beta, x.state, anc,
                               shape.scale, **kw) for x in bf]  # fmt: skip
                est = median_us(fns[0], dev, timer)
                row["us"] = graph_us(fns, dev, timer, est)
                row["status"] = "ok"
            except Exception as exc:  # noqa: BLE001 - a tile that fails to compile or run is a row
                row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            row["wall_s"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "tune.csv", index=False)
    lines = ["# Fused tree kernel tile sweep (tf32, bf16 inputs, draft trees, CUDA-graph replays)", ""]
    ok = table[table.status == "ok"]
    for (shape_name, n), grp in ok.groupby(["shape", "n"]):
        best = pd.concat([grp.sort_values("us").head(3), grp[grp.default]]).drop_duplicates()
        lines += [f"## {shape_name}, n = {n}", "", markdown_table(best), ""]
    (out / "tune.md").write_text("\n".join(lines) + "\n")
    (out / "manifest.json").write_text(json.dumps(build_manifest(config), indent=2, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
