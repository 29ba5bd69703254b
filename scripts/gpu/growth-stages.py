"""Where Weaver's fused growth spends a node: each stage's kernel time, and the barriers (H200, bf16).

    python3 scripts/gpu/growth-stages.py OUT_DIR      (one H200: < 60 s)

DFlash-TfM's draft is mostly Weaver's growth: 0.93 ms of a 1.22 ms step on the tiny family
(`results/2026-12-04-h200-drafter-launches/routes`) and ~5 ms of a 27 ms step at the Qwen3.6-27B shape.
`grow_fused` runs a node as one launch of 9 stages with 8 grid barriers between them (module docstring of
`repro.drafters.growth_kernels`). Its `staged` mode launches each stage on its own over the same programs
and partitions, without barriers. Stages 1-2 (`W_e E[token]`, then q / k / v of the RMSNorm) depend only
on the node's (depth, token). A table computed for every pool token before the growth could replace them.
This script measures what that would remove.

The inputs are `shapes.growth_problem` at the `tiny` and `qwen3.6-27b` shapes, at the default
programs P. For each shape it reports:
- one growth in CUDA graphs (`repro.bench.timing.graph_us`), fused (barriers) and staged;
- the staged growth's kernels from one eager run under the torch profiler. Each is attributed to its stage
  by launch order (a scored node launches the pop, stages 1-8 and the ranking; the last node the pop alone)
  and summed per stage, in us per node.

The fused time minus the staged kernels' sum bounds what the barriers and the stage hand-offs cost.
Writes OUT_DIR/growth-stages.json and OUT_DIR/growth-stages.md; prints the markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.timing import TimerConfig, graph_us  # noqa: E402
from repro.drafters.growth_kernels import STAGES, device_programs, grow_fused  # noqa: E402
from repro.drafters.shapes import growth_problem  # noqa: E402

DEV = torch.device("cuda")
TIMER = TimerConfig(warmup_ms=2.0, rep_ms=20.0, graph_replays=5)
NAMES = ["pop", "1 W_e E[token]", "2 norm, q k v", "3 attention", "4 o_proj", "5 norm, gate / up",
         "6 down", "7 norm, out_proj", "8 pool scores", "9 ranking"]  # fmt: skip


def stage_us(problem: tuple, programs: int) -> list[float]:
    """Summed kernel us per stage of one staged growth (eager, profiled), in launch order."""
    budget = problem[2]
    grow_fused(*problem, programs=programs, staged=True)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grow_fused(*problem, programs=programs, staged=True)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "_step_kernel" in e.name]
    kernels.sort(key=lambda e: e.time_range.start)
    want = budget * STAGES + 1
    if len(kernels) != want:
        raise RuntimeError(f"{len(kernels)} node kernels profiled, {want} expected")
    sums = [0.0] * STAGES
    for i, e in enumerate(kernels[: budget * STAGES]):
        sums[i % STAGES] += e.time_range.elapsed_us()
    return sums


def shape_row(shape: str) -> dict[str, Any]:
    problem = growth_problem(shape, torch.bfloat16, DEV)
    weaver, budget, k = problem[0], problem[2], problem[5].shape[1]
    programs = device_programs(weaver.config, budget, k, DEV)
    fused = grow_fused(*problem, programs=programs)
    torch.cuda.synchronize()
    staged = grow_fused(*problem, programs=programs, staged=True)
    same = bool(torch.equal(fused.tokens, staged.tokens) and torch.equal(fused.parents, staged.parents))
    row: dict[str, Any] = {"shape": shape, "programs": fused.programs, "nodes": budget, "same_tree": same}
    row["fused_us"] = graph_us([lambda: grow_fused(*problem, programs=programs)], DEV, TIMER, 1000.0)
    row["staged_us"] = graph_us(
        [lambda: grow_fused(*problem, programs=programs, staged=True)], DEV, TIMER, 1000.0
    )
    row["stage_us_per_node"] = [s / budget for s in stage_us(problem, programs)]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# growth-stages: Weaver's fused growth by stage, bf16, H200", ""]
    for r in rows:
        per = r["stage_us_per_node"]
        total = sum(per)
        lines += [
            f"## {r['shape']}: {r['nodes']} scored nodes, P = {r['programs']}, staged tree = fused tree: "
            f"{r['same_tree']}",
            "",
            f"- one growth in graphs: fused {r['fused_us']:.0f} us "
            f"({r['fused_us'] / r['nodes']:.1f} a node), "
            f"staged {r['staged_us']:.0f} us ({r['staged_us'] / r['nodes']:.1f} a node)",
            f"- staged kernels (eager): {total:.1f} us a node; fused minus that: "
            f"{r['fused_us'] / r['nodes'] - total:.1f} us a node (barriers, hand-offs)",
            "",
            "| stage | us a node | share of the kernels |",
            "|---|--:|--:|",
        ]
        lines += [f"| {name} | {us:.2f} | {us / total:.0%} |" for name, us in zip(NAMES, per)]
        lines.append("")
    return "\n".join(lines)


@torch.no_grad()
def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in ("tiny", "qwen3.6-27b"):
        rows.append(shape_row(shape))
        (out / "growth-stages.json").write_text(json.dumps(rows, indent=1))
        (out / "growth-stages.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
