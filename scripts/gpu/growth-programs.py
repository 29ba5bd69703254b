"""Weaver's fused growth at the tiny shape over programs P and warps: is the default P fastest? (GPU, bf16)

    python3 scripts/gpu/growth-programs.py OUT_DIR [--width 4] [--programs 1,2,4,8,16,32,64] [--warps 4,8,16]

At the tiny family's shape a Weaver step is latency bound (~28 us a launch of 4 nodes, 9 stages and 8 grid
barriers between them: results/2026-12-04-h200-weaver-tile/callBM), and DFlash-TfM's draft is 1.7x its
verify there. Fewer programs make each barrier cheaper (P = 1: a block barrier) and each stage's loads
longer; more warps a program give one program more loads in flight. This times one growth
(`shapes.growth_problem("tiny")`, budget 32) in CUDA graphs for every (P, num_warps) pair and checks each
tree against the one of P = 1 at the same num_warps (a row's value does not depend on P; num_warps may change
the rounding), with the barrier error flag.

Writes OUT_DIR/growth-programs.json and OUT_DIR/growth-programs.md; prints the markdown.
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

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=20.0, graph_replays=5)


def tree(growth: Any) -> tuple[list[int], list[int]]:
    return growth.tokens.tolist(), growth.parents.tolist()


@torch.no_grad()
def main(out: Path, width: int, programs: tuple[int, ...], warps: tuple[int, ...]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    problem = growth_problem("tiny", torch.bfloat16, DEV)
    weaver, budget, k = problem[0], problem[2], problem[5].shape[1]
    default = device_programs(weaver.config, budget, k, DEV, width=width)
    rows: list[dict[str, Any]] = []
    for w in warps:
        ref = None
        for p in sorted({*programs, default}):
            fused = grow_fused(*problem, programs=p, width=width, num_warps=w)
            torch.cuda.synchronize()
            got = tree(fused)
            ref = ref or got
            call = functools.partial(grow_fused, *problem, programs=p, width=width, num_warps=w)
            us = graph_us([call], DEV, TIMER, 1000.0)
            row = {"width": width, "budget": budget, "num_warps": w, "programs_asked": p,
                   "programs": fused.programs, "default": p == default, "error_flag": int(fused.error),
                   "same_tree_as_p1": got == ref, "growth_us": us}  # fmt: skip
            row["us_per_launch"] = row["growth_us"] / (-(-budget // width) + 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "growth-programs.json").write_text(json.dumps(rows, indent=1))
    best = min(rows, key=lambda r: r["growth_us"])
    base = next((r for r in rows if r["default"] and r["num_warps"] == 8), best)
    lines = [
        f"# growth-programs: Weaver's fused growth, tiny shape, budget {budget}, width {width}, bf16",
        "",
        f"default P {default} at {base['num_warps']} warps: {base['growth_us']:.1f} us; fastest: "
        f"P {best['programs']} at {best['num_warps']} warps, {best['growth_us']:.1f} us "
        f"({base['growth_us'] / best['growth_us']:.2f}x)",
        "",
        "| warps | P asked | P | growth us | us a launch | same tree as P = 1 | error flag |",
        "|--:|--:|--:|--:|--:|---|--:|",
    ]
    for r in rows:
        mark = " (default)" if r["default"] else ""
        lines.append(
            f"| {r['num_warps']} | {r['programs_asked']}{mark} | {r['programs']} | {r['growth_us']:.1f} | "
            f"{r['us_per_launch']:.1f} | {'yes' if r['same_tree_as_p1'] else 'no'} | {r['error_flag']} |"
        )
    (out / "growth-programs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--programs", default="1,2,4,8,16,32,64")
    parser.add_argument("--warps", default="4,8,16")
    a = parser.parse_args()
    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    main(a.out, a.width, ints(a.programs), ints(a.warps))
