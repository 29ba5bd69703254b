"""Where the host's time goes in a decode step on the graphed engine (issue 10: harness overhead), H200.

    python3 scripts/gpu/host-profile.py OUT_DIR          (one H200: < 60 s)
    python3 scripts/gpu/host-profile.py OUT_DIR cpu      (a CPU dry run of the plumbing: float32, eager)

At the tiny family's width a decode graph runs ~45 us and a 33-node verify ~120 us, while a speculative
step takes ~1 ms of wall time: the host's Python between the graph launches is the step. This runs the
routes of scripts/gpu/routes-ab.py (its setup: the embedded tiny-qwen35 in bf16 on a GraphedTarget with CUDA
graphs, greedy, its prompts) under cProfile after a warm-up, one prompt of NEW_TOKENS per route, and writes
per route the wall ms per step and the top functions by own time and by cumulative time (ms per step), so
that the host path can be cut where it costs. cProfile slows Python down (~1.5-2x): the shares count, not
the absolute times. The prompt's prefill (eager, once a prompt) is left out; each function's callers
that called it most are listed. Writes OUT_DIR/host-profile.json and OUT_DIR/host-profile.md; prints the
markdown.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's repro, not an installed one

from _routes_ab import ab  # noqa: E402 - the routes, prompts and device choice of routes-ab

import repro.decoding.engine as engine  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402

ROUTES = ab.ROUTES + [
    {"name": "specla-b32", "kind": "specla", "budget": 32},
    {"name": "fla-sd-k6", "kind": "fla_sd", "k": 6},
]
NEW_TOKENS = 16 if ab.CPU else 96
TOP = 25


def _name(key: tuple[str, int, str]) -> str:
    file, line, name = key
    return f"{name} ({Path(file).name}:{line})" if line else f"{name} ({file})"


def top(stats: pstats.Stats, key: str, steps: int) -> list[dict[str, Any]]:
    """The TOP functions by ``key`` ("tottime" or "cumtime"), ms per step, each with its three callers
    that called it most (calls per step)."""
    rows = []
    entries = stats.stats  # type: ignore[attr-defined] - {(file, line, name): (cc, nc, tt, ct, callers)}
    order = sorted(entries.items(), key=lambda e: e[1][2 if key == "tottime" else 3], reverse=True)
    for fn, (_, calls, tt, ct, callers) in order[:TOP]:
        most = sorted(callers.items(), key=lambda c: c[1][1], reverse=True)[:3]
        by = ", ".join(f"{_name(c)} {v[1] / steps:.1f}" for c, v in most)
        rows.append(dict(function=_name(fn), calls_per_step=calls / steps, own_ms_per_step=1e3 * tt / steps,
                         cum_ms_per_step=1e3 * ct / steps, callers=by))  # fmt: skip
    return rows


def _unprofiled(prof: cProfile.Profile, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``prof`` paused while it runs (the engine's prompt prefill, an eager forward once a
    prompt: the tables are the decode loop's, per step)."""

    def unprofiled(*args: Any, **kwargs: Any) -> Any:
        prof.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            prof.enable()

    return unprofiled


def main() -> None:
    start = time.monotonic()
    out, target, routes, ps = ab.family_session(ROUTES)
    prompt = ps[0]
    device = "CPU (dry run)" if ab.CPU else torch.cuda.get_device_name()
    res: dict[str, Any] = {"device": device, "routes": []}
    for spec, route in zip(ROUTES, routes):
        generate(target, prompt, route, NEW_TOKENS)  # warm-up: compiles, buffers, graphs
        prof = cProfile.Profile()
        with ab.patched(engine, "_prefill", _unprofiled(prof, engine._prefill)):
            prof.enable()
            try:
                r = generate(target, prompt, route, NEW_TOKENS)
            finally:
                prof.disable()
        steps = max(r.steps, 1)
        stats = pstats.Stats(prof)
        device_s = sum((r.device_stage_s or r.stage_s).values())
        row = dict(route=spec["name"], steps=r.steps, wall_ms_per_step=1e3 * r.decode_s / steps,
                   device_ms_per_step=1e3 * device_s / steps, by_own=top(stats, "tottime", steps),
                   by_cum=top(stats, "cumtime", steps))  # fmt: skip
        res["routes"].append(row)
        print(f"{spec['name']}: {r.steps} steps, {row['wall_ms_per_step']:.3f} ms/step (profiled)")
    res["seconds"] = time.monotonic() - start
    (out / "host-profile.json").write_text(json.dumps(res, indent=1))
    lines = [f"# host-profile on {device} ({res['seconds']:.0f} s): tiny-qwen35 {ab.DTYPE}, cProfile on", ""]
    head = "| calls/step | own ms/step | cum ms/step | called most by (calls/step) |"
    for r in res["routes"]:
        lines += [f"## {r['route']}: {r['steps']} steps, {r['wall_ms_per_step']:.3f} ms/step wall "
                  f"(profiled), {r['device_ms_per_step']:.3f} device (stage marks)"]  # fmt: skip
        for title, key in (("by own time", "by_own"), ("by cumulative time", "by_cum")):
            lines += ["", f"| {title} {head}", "|---|--:|--:|--:|---|"]
            lines += [f"| `{f['function']}` | {f['calls_per_step']:.1f} | {f['own_ms_per_step']:.3f} | "
                      f"{f['cum_ms_per_step']:.3f} | {f['callers']} |" for f in r[key]]  # fmt: skip
        lines.append("")
    text = "\n".join(lines)
    (out / "host-profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
