"""Where a graphed step's device time goes between its graphs (issue 10: wall within 10% of busy), H200.

    python3 scripts/gpu/step-gaps.py OUT_DIR      (one H200: < 3 min)

`results/2026-12-04-h200-derive-rows/callCI/routes` has DDTree and chain DFlash at a wall / busy of 1.12:
about 35 us a step that no graph replay accounts for, while the host's stages take ~0.18 ms of a 0.34 ms
step (so the host is not the bound). This script asks the device. For each route of ROUTES on the embedded
tiny-qwen35 (bf16, graphed, as `repro run` builds it) it warms up, then profiles one generation of
NEW_TOKENS tokens with the torch profiler (CUDA activity: every kernel, graph-launched ones included, and
every copy, each with the correlation id of the host call that launched it) under each VARIANTS entry: the
engine as it is, and without its timing events (StageClock's marks and the busy recorder's two events a
replay, as routes-ab's ``no_clock_events``).

From the trace: the device span of the decode, the time some kernel or copy runs (busy), and every gap
between one device activity's end and the next one's start, classed by what launched the two: inside one
graph replay (the same cudaGraphLaunch), or between launches (graph -> graph, graph -> copy, copy -> graph,
...). Per verify step, from two profiled generations (NEW_TOKENS and SHORT tokens: their difference, which
cancels the prefill and first step): span, busy, gaps by class; beside them the wall time a step.

STEP_GAPS_ROUTES / STEP_GAPS_VARIANTS (comma-separated names) keep only those routes / variants.

Writes OUT_DIR/step-gaps.json and OUT_DIR/step-gaps.md; prints the markdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from _routes_ab import ab  # noqa: E402 - routes-ab's family target, graphed routes and unclocked engine

from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402

ROUTES = [
    {"name": "ar", "kind": "ar"},
    {"name": "dflash-chain", "kind": "dflash_chain"},
    {"name": "ddtree-b32", "kind": "ddtree", "budget": 32},
    {"name": "dflash-tfm-b32", "kind": "dflash_tfm", "budget": 32},
]
NEW_TOKENS = 96
SHORT = 16  # a second, short generation: per step = (long - short) / (its steps - the short one's)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


VARIANTS = {"default": contextlib.nullcontext, "no_clock_events": ab.unclocked}


def launcher(name: str) -> str:
    """A short class of the host call that launched a device activity."""
    if "GraphLaunch" in name:
        return "graph"
    if "Memcpy" in name or "Memset" in name:
        return "copy"
    if "LaunchKernel" in name:
        return "kernel"
    return name or "?"


def gaps(trace: dict) -> dict[str, Any]:
    """Span, busy time and the gaps between device activities of a chrome trace, by launcher class."""
    events = trace["traceEvents"]
    runtime = {
        e["args"]["correlation"]: e["name"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    acts = sorted(
        (e for e in events if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"), key=lambda e: e["ts"]
    )
    if not acts:
        return {"activities": 0}
    kinds = Counter(launcher(runtime.get(e["args"].get("correlation"), "")) for e in acts)
    by_class: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    busy, end, prev = 0.0, acts[0]["ts"], None
    for e in acts:
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, end))
        if prev is not None and start > end:
            a, b = prev["args"].get("correlation"), e["args"].get("correlation")
            cls = "inside a graph" if a == b else (
                f"{launcher(runtime.get(a, ''))} -> {launcher(runtime.get(b, ''))}"
            )  # fmt: skip
            by_class[cls] += start - end
            counts[cls] += 1
        if stop >= end:
            end, prev = stop, e
    span = end - acts[0]["ts"]
    return {"activities": len(acts), "launched_by": dict(kinds), "span_us": span, "busy_us": busy,
            "gap_us": dict(by_class), "gap_count": dict(counts)}  # fmt: skip


def profiled(target: GraphedTarget, prompt: list[int], route: Any, tokens: int) -> tuple[Any, dict[str, Any]]:
    """One generation of ``tokens`` under the profiler: its result and :func:`gaps` of its trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        r = generate(target, prompt, route, tokens)
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return r, gaps(json.loads(path.read_text()))


@torch.no_grad()
def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model, tok = ab.open_family()  # bf16 on the Triton kernels
    suite = load_suite("mt_bench", 1, 42)[0]
    prompt = tok.chat_prompt([{"role": "user", "content": format_turn("mt_bench", suite.turns[0])}])
    rows = []
    names = os.environ.get("STEP_GAPS_ROUTES", "")
    specs = [s for s in ROUTES if not names or s["name"] in names.split(",")]
    variants = os.environ.get("STEP_GAPS_VARIANTS", ",".join(VARIANTS)).split(",")
    for variant in variants:
        with VARIANTS[variant]():
            target, routes = ab.graphed_routes(model, specs)
            for spec, route in zip(specs, routes):
                generate(target, prompt, route, NEW_TOKENS)  # warm-up
                walls = [generate(target, prompt, route, NEW_TOKENS) for _ in range(3)]
                long = profiled(target, prompt, route, NEW_TOKENS)
                short = profiled(target, prompt, route, SHORT)
                steps = long[0].steps - short[0].steps  # the difference cancels the prefill and first step
                got = {
                    k: long[1].get(k, 0) - short[1].get(k, 0) for k in ("activities", "span_us", "busy_us")
                }
                classes = set(long[1].get("gap_us", {})) | set(short[1].get("gap_us", {}))
                per_step = {
                    c: (long[1]["gap_us"].get(c, 0.0) - short[1]["gap_us"].get(c, 0.0)) / max(steps, 1)
                    for c in classes
                }
                count = {
                    c: (long[1]["gap_count"].get(c, 0) - short[1]["gap_count"].get(c, 0)) / max(steps, 1)
                    for c in classes
                }
                wall = sum(w.decode_s for w in walls) / sum(w.steps for w in walls)
                row = {
                    "variant": variant, "route": spec["name"], "steps": steps, "wall_ms_per_step": 1e3 * wall,
                    **got, "per_step_us": per_step, "per_step_count": count, "long": long[1],
                    "short": short[1],
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            del target, routes
            torch.cuda.empty_cache()
    classes = sorted({c for r in rows for c in r["per_step_us"]})
    lines = [
        "# step-gaps: device time between a graphed step's launches, tiny-qwen35 bf16, H200",
        "",
        f"One mt_bench prompt; us a verify step (AR: a decode step): the profiled generations of "
        f"{NEW_TOKENS} and {SHORT} new tokens, their difference over the difference of their steps; wall: "
        "the mean of 3 unprofiled generations.",
        "",
        "| variant | route | steps | wall us | span us | busy us | " + " | ".join(classes) + " |",
        "|---|---|--:|--:|--:|--:|" + "--:|" * len(classes),
    ]
    for r in rows:
        s = max(r["steps"], 1)
        cells = [f"{r['per_step_us'].get(c, 0.0):.1f}" for c in classes]
        lines.append(
            f"| {r['variant']} | {r['route']} | {r['steps']} | {1e3 * r['wall_ms_per_step']:.1f} | "
            f"{r.get('span_us', 0) / s:.1f} | {r.get('busy_us', 0) / s:.1f} | " + " | ".join(cells) + " |"
        )
    lines += ["", "Gaps a step by class: count, us (us each):", ""]
    for r in rows:
        parts = [
            f"{c} {r['per_step_count'][c]:.2f}, {r['per_step_us'][c]:.1f} ({r['per_step_us'][c] / n:.1f})"
            for c in classes
            if (n := r["per_step_count"].get(c, 0)) >= 0.5
        ]
        lines.append(f"- {r['variant']} {r['route']}: " + "; ".join(parts))
    md = "\n".join(lines) + "\n"
    (out / "step-gaps.md").write_text(md)
    (out / "step-gaps.json").write_text(json.dumps(rows, indent=1))
    print(md)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
