"""Where a scale row's step goes, stage by stage and kernel group by kernel group (H200, bf16).

    python3 scripts/gpu/scale-profile.py OUT_DIR [SHAPE [ROUTE ...]]  (default: qwen3.6-27b dflash_tfm ddtree)

2026-12-02's scale rows verified DFlash-TfM's 65-node trees in 19.9 ms at the Qwen3.6-27B shape, where
``repro bench model``'s verify(64) graph takes 17.1 ms (matmuls 14.2, Triton glue 1.1, tree kernel 0.9,
attention 0.6). This script runs the scale rows' own setup (``repro.bench.scale``: the random target,
the routes' random drafters, paper-MAL replayed acceptance) on the graphed engine *without* CUDA graphs
(``GraphedTarget(graphs=False)``: the same kernels, launched eagerly, so the torch profiler attributes
each kernel to the engine stage that launched it), one prompt of ``NEW`` tokens after a warm-up, and
reports per route and stage: the kernels' summed device time per step by group
(``repro.bench.model.kernel_group``), their count, the top kernels by time, the stage's host time (its
profiler range) and its top host ops by self CPU time. ``SCALE_PROFILE_GRAPHS=1`` keeps the CUDA graphs
(the engine as it runs; kernels inside replays are then not attributed): the host's time per stage, where
the device waits for the host at small widths (e.g. ``tiny``: the EAGLE routes' draft stage is twice the
proposal's graph on the device). The eager wall time
says nothing (Python launches); the kernel sums are what a graph replays, less the gaps between kernels.
Writes OUT_DIR/scale-profile.json and OUT_DIR/scale-profile.md; prints the markdown.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import kernel_group  # noqa: E402
from repro.bench.scale import (  # noqa: E402
    ScaleConfig,
    build_routes,
    build_target,
    parse_acceptance,
    prompt_ids,
)
from repro.decoding import engine  # noqa: E402
from repro.decoding.engine import STAGES, generate  # noqa: E402
from repro.decoding.replayed import ReplayedAcceptance  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a dry run of the plumbing
NEW = 48
GRAPHS = os.environ.get("SCALE_PROFILE_GRAPHS") == "1"  # the host's view: graphs replayed, as the engine runs
TOP = 12


class StageRanges:
    """Wraps StageClock.mark: each mark closes the open stage's profiler range and opens the next one."""

    def __init__(self) -> None:
        self.index = 0
        self.open: record_function | None = None
        self.original = engine.StageClock.mark

    def __enter__(self) -> StageRanges:
        ranges = self

        def mark(clock: engine.StageClock) -> None:
            ranges.original(clock)
            if ranges.open is not None:
                ranges.open.__exit__(None, None, None)
                ranges.open = None
            if len(clock._times) != 0:  # a step's stages: marks 1..len(STAGES) open one
                ranges.open = record_function(f"stage::{STAGES[len(clock._times) - 1]}")
                ranges.open.__enter__()

        engine.StageClock.mark = mark
        return self

    def __exit__(self, *exc: object) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
        engine.StageClock.mark = self.original


def stage_of(event) -> str:  # noqa: ANN001 - a profiler FunctionEvent
    """The stage range enclosing a kernel's launching CPU op ("outside" when none)."""
    cpu = event
    while cpu is not None:
        if cpu.name.startswith("stage::"):
            return cpu.name[len("stage::") :]
        cpu = cpu.cpu_parent
    return "outside"


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def counter() -> list[float]:
    return [0, 0.0]


def profile_route(target: GraphedTarget, route, ids: list[int]) -> dict:  # noqa: ANN001
    rule = route.rule
    if isinstance(rule, ReplayedAcceptance):
        rule.reset()
    generate(target, ids, route, 16)  # warm: compiles, buffers
    if isinstance(rule, ReplayedAcceptance):
        rule.reset()
    sync()
    with StageRanges(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        res = generate(target, ids, route, NEW)
        sync()
    # kernels: attribute through the CPU op that launched them (the runtime launch's parent chain)
    groups: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(counter)
    )
    names: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(counter)
    )
    host: dict[str, float] = collections.defaultdict(float)  # a stage's range: host microseconds
    host_ops: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            continue
        if e.name.startswith("stage::"):
            host[e.name[len("stage::") :]] += e.cpu_time_total
        else:
            host_ops[stage_of(e)][e.name[:60]] += e.self_cpu_time_total
        for k in e.kernels:
            stage = stage_of(e)
            us = k.duration
            g = groups[stage][kernel_group(k.name)]
            g[0] += 1
            g[1] += us
            n = names[stage][k.name[:90]]
            n[0] += 1
            n[1] += us
    steps = max(res.steps, 1)
    out = {"route": route.name, "steps": res.steps, "mal": sum(res.accepted_lengths) / steps, "stages": {}}
    for stage in (*STAGES, "outside"):
        if stage not in groups and stage not in host:
            continue
        g = {k: {"kernels": v[0] / steps, "us": v[1] / steps} for k, v in groups.get(stage, {}).items()}
        top = sorted(names.get(stage, {}).items(), key=lambda kv: -kv[1][1])[:TOP]
        ops = sorted(host_ops.get(stage, {}).items(), key=lambda kv: -kv[1])[:TOP]
        out["stages"][stage] = {
            "us": sum(v["us"] for v in g.values()),
            "kernels": sum(v["kernels"] for v in g.values()),
            "host_us": host.get(stage, 0.0) / steps,
            "groups": g,
            "top": [{"name": k, "calls": v[0] / steps, "us": v[1] / steps} for k, v in top],
            "host_top": [{"name": k, "us": v / steps} for k, v in ops],
        }
    return out


def markdown(res: dict) -> str:
    lines = [
        f"# scale-profile: {res['shape']} on {res['device']} ({res['seconds']:.0f} s), kernels a step",
        "",
    ]
    lines.append(
        "The graphed engine with its CUDA graphs (kernels in replays not attributed), by engine stage."
        if res.get("graphs")
        else "Eager launches of the graphed engine's kernels (no CUDA graphs), by engine stage."
    )
    for r in res["routes"]:
        lines += ["", f"## {r['route']}: {r['steps']} steps, MAL {r['mal']:.2f}", ""]
        lines += ["| stage | host us / step | kernels / step | kernel us / step | groups (us / step) |"]
        lines += ["|---|--:|--:|--:|---|"]
        for stage, s in r["stages"].items():
            parts = sorted(s["groups"].items(), key=lambda kv: -kv[1]["us"])
            text = "; ".join(f"{k} {v['kernels']:.0f}x {v['us']:.0f}" for k, v in parts)
            lines.append(f"| {stage} | {s['host_us']:.0f} | {s['kernels']:.0f} | {s['us']:.0f} | {text} |")
        for stage, s in r["stages"].items():
            lines += ["", f"Top kernels of `{stage}` (us / step, calls / step):", ""]
            lines += [f"- {t['us']:.0f} us, {t['calls']:.1f}x: `{t['name']}`" for t in s["top"]]
            lines += ["", f"Top host ops of `{stage}` (self CPU us / step):", ""]
            lines += [f"- {t['us']:.0f} us: `{t['name']}`" for t in s["host_top"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = sys.argv[2] if len(sys.argv) > 2 else "qwen3.6-27b"
    names = sys.argv[3:] or ["dflash_tfm", "ddtree"]
    start = time.perf_counter()
    cfg = ScaleConfig(shapes=[shape], routes={shape: names}, prompts=1, max_new_tokens=NEW)
    model = build_target(shape, cfg, DEV)
    target = GraphedTarget(model, graphs=GRAPHS and DEV.type == "cuda")
    routes = build_routes(shape, cfg, target, parse_acceptance(cfg.acceptance))
    ids = prompt_ids(model.config.vocab_size, cfg.prompt_len, 0, cfg.seed)
    device = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu"
    res = {"device": device, "shape": shape, "new_tokens": NEW, "graphs": target.graphs, "routes": []}
    for route in routes:
        res["routes"].append(profile_route(target, route, ids))
        res["seconds"] = time.perf_counter() - start
        (out_dir / "scale-profile.json").write_text(json.dumps(res, indent=1))
        md = markdown(res)
        (out_dir / "scale-profile.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
