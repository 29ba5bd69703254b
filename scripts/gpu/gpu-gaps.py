"""Where the device idles in a decode step on the graphed engine: a CUPTI timeline (torch.profiler), H200.

    python3 scripts/gpu/gpu-gaps.py OUT_DIR          (one H200: < 90 s)

busy-time.py finds device time the graphs do not account for (SpecLA's draft stage: 0.75 ms of device time
against 0.61 of graph replays) while cProfile has the host waiting most of a step. This decodes the embedded
tiny-qwen35 in bf16 on the graphed engine (greedy; the routes of ROUTES, one warm-up generation each) under
torch.profiler with CUDA activities and, from the trace, lists every idle gap of the device between two
kernels, memcpys or memsets, with the work on either side and the host call (cudaGraphLaunch,
cudaLaunchKernel, cudaMemcpyAsync, ...) that launched the work after it: launched before the gap opened
(the device's own latency) or after (the host was late). Writes OUT_DIR/gpu-gaps.json and OUT_DIR/gpu-gaps.md
(per route: device ms per step, busy, gaps by kind, the largest gaps); prints the markdown.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from _routes_ab import ab  # noqa: E402

from repro.decoding.engine import generate  # noqa: E402

ROUTES = [
    {"name": "ddtree-b32", "kind": "ddtree", "budget": 32},
    {"name": "specla-b32", "kind": "specla", "budget": 32},
    {"name": "fla-sd-k6", "kind": "fla_sd", "k": 6},
]
NEW_TOKENS = 64
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TOP = 12


def timeline(trace: dict) -> tuple[list[dict], dict[int, dict]]:
    """The device's work sorted by start, and the host runtime calls by correlation id."""
    work = [e for e in trace["traceEvents"] if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"]
    work.sort(key=lambda e: e["ts"])
    host = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "cuda_runtime" and e.get("ph") == "X":
            host[e.get("args", {}).get("correlation")] = e
    return work, host


def gaps(work: list[dict], host: dict[int, dict]) -> list[dict]:
    """Every idle interval between two device events (us), with what launched the later one and when."""
    out = []
    end = None
    prev = None
    for e in work:
        if end is not None and e["ts"] > end:
            call = host.get(e.get("args", {}).get("correlation"), {})
            launched = call.get("ts")
            out.append(dict(
                us=e["ts"] - end,
                before=prev["name"][:60],
                after=e["name"][:60],
                call=call.get("name", "?"),
                host_late_us=None if launched is None else launched + call.get("dur", 0) - end,
            ))  # fmt: skip
        if end is None or e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    return out


def main() -> None:
    start = time.monotonic()
    out, target, routes, ps = ab.family_session(ROUTES)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "routes": []}
    head = f"# gpu-gaps on {res['device']}: tiny-qwen35 {ab.DTYPE}, {NEW_TOKENS} new tokens, one prompt"
    lines = [head, ""]
    for spec, route in zip(ROUTES, routes):
        generate(target, ps[0], route, NEW_TOKENS)  # warm-up
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            r = generate(target, ps[0], route, NEW_TOKENS)
            torch.cuda.synchronize()
        path = out / f"{spec['name']}.trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        path.unlink()
        work, host = timeline(trace)
        found = gaps(work, host)
        steps = max(r.steps, 1)
        span = (work[-1]["ts"] + work[-1]["dur"] - work[0]["ts"]) if work else 0.0
        busy = sum(e["dur"] for e in work)
        by_call: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # gaps, us
        for g in found:
            late = g["host_late_us"] is not None and g["host_late_us"] > 0
            row = by_call[f"{g['call']} ({'host late' if late else 'launched ahead'})"]
            row[0] += 1
            row[1] += g["us"]
        row = dict(route=spec["name"], steps=r.steps, wall_ms_per_step=1e3 * r.decode_s / steps,
                   span_ms_per_step=span / 1e3 / steps, kernels_ms_per_step=busy / 1e3 / steps,
                   gap_ms_per_step=sum(g["us"] for g in found) / 1e3 / steps,
                   gaps_by_call={k: [v[0] / steps, v[1] / 1e3 / steps] for k, v in by_call.items()},
                   top=sorted(found, key=lambda g: -g["us"])[:TOP])  # fmt: skip
        res["routes"].append(row)
        lines += [
            f"## {row['route']}: {r.steps} steps (profiled), wall {row['wall_ms_per_step']:.3f} ms/step, "
            f"device span {row['span_ms_per_step']:.3f}, kernels {row['kernels_ms_per_step']:.3f}, "
            f"idle gaps {row['gap_ms_per_step']:.3f}",
            "",
            "| gaps before work launched by | gaps/step | ms/step |",
            "|---|--:|--:|",
        ]
        for k, (n, ms) in sorted(row["gaps_by_call"].items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| {k} | {n:.1f} | {ms:.3f} |")
        lines += ["", "| largest gaps (us) | before | after | launched by | host late by (us) |"]
        lines += ["|--:|---|---|---|--:|"]
        for g in row["top"]:
            late = "-" if g["host_late_us"] is None else f"{g['host_late_us']:.1f}"
            lines.append(f"| {g['us']:.1f} | `{g['before']}` | `{g['after']}` | {g['call']} | {late} |")
        lines.append("")
        print(f"{spec['name']}: done ({time.monotonic() - start:.0f} s)")
    res["seconds"] = time.monotonic() - start
    (out / "gpu-gaps.json").write_text(json.dumps(res, indent=1))
    text = "\n".join(lines)
    (out / "gpu-gaps.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
