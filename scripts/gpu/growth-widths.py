"""Weaver's growth at the paper's expansion widths: time per growth and tree quality (H200, bf16).

    python3 scripts/gpu/growth-widths.py OUT_DIR [--warps 8,16]     (one H200: about 150 s at 8 warps)

The paper grows its trees "best-first, expanding w = 2..8 frontier nodes per Weaver step". Width 1 is
the exact best-first tree (one Weaver forward a node); width w takes w candidates a step and scores
them in one forward (`repro.drafters.weaver_growth`). The fused kernel (`grow_fused`) runs a step as
one launch whose linears read each weight block once for the step's nodes, so a step should cost about
what a one-node step costs.

Inputs: `shapes.growth_problem` at the `tiny` and `qwen3.6-27b` shapes (random weights, budget
32 / 64), the default programs P. Per shape and width in 1, 2, 4, 8:
- one fused growth in CUDA graphs (`repro.bench.timing.graph_us`): us, us a step, us a node;
- the fused tree against the torch device growth at the same width (same tree, or the first node where
  they part and the score gap there: a bf16 near tie);
- the tree's quality against width 1's: the sum of its nodes' cumulative log q (width 1 maximises it)
  and the share of width 1's nodes (as root paths) it holds.

Writes OUT_DIR/growth-widths.json and OUT_DIR/growth-widths.md; prints the markdown.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.drafters.growth_kernels import device_programs, grow_fused  # noqa: E402
from repro.drafters.shapes import growth_problem  # noqa: E402
from repro.drafters.weaver_growth import DeviceGrowth, grow_on_device  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=20.0, graph_replays=5)
WIDTHS = (1, 2, 4, 8)


def paths(growth: DeviceGrowth) -> set[tuple[int, ...]]:
    """Each real node as its root path of tokens."""
    tokens, parents, _ = growth.real()
    out, memo = set(), {}
    for i, (t, p) in enumerate(zip(tokens, parents)):
        memo[i] = (memo[p] if p >= 0 else ()) + (t,)
        out.add(memo[i])
    return out


def agreement(ref: DeviceGrowth, got: DeviceGrowth) -> dict[str, Any]:
    """Same tree, or where the two part and the score gap there."""
    pairs = list(zip(ref.tokens.tolist(), ref.parents.tolist(), got.tokens.tolist(), got.parents.tolist()))
    first = next((i for i, (a, b, c, d) in enumerate(pairs) if (a, b) != (c, d)), None)
    if first is None:
        return {"same_tree": True}
    return {"same_tree": False, "first_difference": first,
            "score_gap": abs(float(ref.scores[first]) - float(got.scores[first]))}  # fmt: skip


def shape_rows(shape: str, warps_tried: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per width; num_warps other than grow_fused's default 8 tried at widths >= 4 (their
    rounding may differ)."""
    problem = growth_problem(shape, torch.bfloat16, DEV)
    weaver, budget, k = problem[0], problem[2], problem[5].shape[1]
    rows, best = [], None
    for width in WIDTHS:
        programs = device_programs(weaver.config, budget, k, DEV, width=width)
        fused = grow_fused(*problem, programs=programs, width=width)
        torch.cuda.synchronize()
        steps = -(-budget // width)
        row: dict[str, Any] = {"shape": shape, "width": width, "nodes": budget, "steps": steps,
                               "programs": fused.programs, "error_flag": int(fused.error)}  # fmt: skip
        row.update(agreement(grow_on_device(*problem, width=width), fused))
        real = fused.real()
        row["real_nodes"] = len(real[0]) - 1
        row["score_sum"] = sum(real[2])
        best = best or (row["score_sum"], paths(fused))
        row["score_sum_vs_width1"] = row["score_sum"] - best[0]
        row["width1_nodes_held"] = len(paths(fused) & best[1]) / len(best[1])
        for warps in (8, *(w for w in warps_tried if w != 8 and width >= 4)):
            key = "" if warps == 8 else f"_w{warps}"
            if warps != 8:  # the default's programs are fused.programs (above)
                row[f"programs{key}"] = grow_fused(
                    *problem, programs=programs, width=width, num_warps=warps
                ).programs
            call = functools.partial(grow_fused, *problem, programs=programs, width=width, num_warps=warps)
            row[f"growth_us{key}"] = graph_us([call], DEV, TIMER, 1000.0)
        row["us_per_step"] = row["growth_us"] / (steps + 1)  # the root's step included
        row["us_per_node"] = row["growth_us"] / budget
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# growth-widths: Weaver's fused growth at widths 1-8, bf16, H200", ""]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        one = rs[0]["growth_us"]
        extra = sorted({int(k[len("growth_us_w") :]) for r in rs for k in r if k.startswith("growth_us_w")})
        lines += [
            f"## {shape}: budget {rs[0]['nodes']}",
            "",
            "| width | P | launches | growth us | x width 1 | us a launch | "
            + "".join(f"{w} warps: P, us | " for w in extra)
            + "fused = torch tree | sum log q vs w1 | width-1 nodes held |",
            "|--:|--:|--:|--:|--:|--:|" + "--:|" * len(extra) + "---|--:|--:|",
        ]
        for r in rs:
            same = (
                "yes"
                if r["same_tree"]
                else f"parts at node {r['first_difference']} (gap {r['score_gap']:.2g})"
            )
            warps = "".join(
                f"{r[f'programs_w{w}']}, {r[f'growth_us_w{w}']:.0f} | " if f"growth_us_w{w}" in r else " | "
                for w in extra
            )
            lines.append(
                f"| {r['width']} | {r['programs']} | {r['steps'] + 1} | {r['growth_us']:.0f} | "
                f"{one / r['growth_us']:.2f}x | {r['us_per_step']:.1f} | {warps}{same} | "
                f"{r['score_sum_vs_width1']:+.2f} | {r['width1_nodes_held']:.0%} |"
            )
        lines.append("")
    return "\n".join(lines)


@torch.no_grad()
def main(out: Path, warps_tried: tuple[int, ...]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for shape in ("tiny", "qwen3.6-27b"):
        rows += shape_rows(shape, warps_tried)
        (out / "growth-widths.json").write_text(json.dumps(rows, indent=1))
        (out / "growth-widths.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--warps", default="8", help="num_warps to time at widths >= 4, comma-separated")
    args = parser.parse_args()
    main(args.out, tuple(int(w) for w in args.warps.split(",")))
