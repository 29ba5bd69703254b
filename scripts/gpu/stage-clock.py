"""Do CUDA events around graph replays see the replays' work? With and without dependent launch (H200).

    python3 scripts/gpu/stage-clock.py OUT_DIR      (one H200: < 90 s)

results/2026-12-02-h200-growth-residency found the engine's per-stage device times (CUDA events recorded at
the stage marks, no sync: ``repro.decoding.engine.StageClock``) missing most of a step at the real shapes:
AR at the Qwen3.6-27B shape put 0.39 ms of a 13.8 ms step into its stages, the scale rows put nearly every
speculative step into the last stage. Suspect: programmatic dependent launch. Every Triton kernel of the
decode and verify graphs triggers its dependents at its start (``griddepcontrol.launch_dependents``), so
the kernels of a graph launch as soon as their predecessor *starts*; if an event recorded after the graph is
released the same way, it completes when the graph's last kernel starts, not when it ends. The numbers
also fit a second reading: the events complete as soon as they are recorded, so they time the host's
intervals between marks (at the tiny family these are close to the device's, which is why its stage sums
looked right; at the real shapes the host waits only in the step's last stage, at the one read).

At the GDN-1.3B shape (random bf16 weights, ``repro.bench.model.build_model``; its decode graph ~1.1 ms), for
dependent launch on and off (a fresh GraphedTarget each, graphs captured inside the setting):

1. ``REPS`` back-to-back replays of the decode graph with an event before and after each, no sync between:
   the events' median per replay against the wall time of the same replays between two synchronizes;
2. the same with a plain torch op (a copy) after each replay, before the closing event;
3. ``repro.decoding.engine.generate`` with AR (``greedy_decode``, one step ahead) over ``TOKENS`` tokens:
   the summed stage device times per step against the wall time per step.

If dependent launch is the cause, (1) and (3) fall far below the wall time with it on and match with it off;
if the events time the host, both fall below the wall time either way.
Writes OUT_DIR/stage-clock.json and OUT_DIR/stage-clock.md and prints the markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import build_model, gdn_1p3b  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402
from repro.decoding.routes import build_route  # noqa: E402
from repro.gdn.triton_common import dependent_launch  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402

DEV = torch.device("cuda")
REPS = 30
TOKENS = 48
PROMPT = 64


def replays(target: GraphedTarget, after: bool) -> dict:
    """Events around each of REPS decode-graph replays (``after``: a small torch op before the closing
    event) against the wall time of the same REPS replays between synchronizes (after an AR generate:
    the decoder holds a state; its length is reset before each replay)."""
    call = target._decode_call()
    length = target.decoder.length
    saved = length.clone()  # every replay decodes at the same position (the graph advances the length)
    scratch = torch.zeros(1024, device=DEV)
    pairs = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        length.copy_(saved)
        a.record()
        call()
        if after:
            scratch.add_(1.0)
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - t0) / REPS
    events_ms = statistics.median(a.elapsed_time(b) for a, b in pairs)
    return {"events_ms": events_ms, "wall_ms": wall_ms, "ratio": events_ms / wall_ms}


def ar_stages(target: GraphedTarget, vocab: int) -> dict:
    route = build_route({"kind": "ar"}, vocab, "greedy", 0.0, 0, target=target)
    prompt = torch.randint(0, vocab, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    generate(target, prompt, route, 8)  # warm
    res = generate(target, prompt, route, TOKENS)
    steps = max(res.steps, 1)
    stages = {k: 1e3 * v / steps for k, v in (res.device_stage_s or {}).items()}
    wall = 1e3 * res.decode_s / steps
    return {"stages_ms": stages, "stage_sum_ms": sum(stages.values()), "wall_ms": wall,
            "ratio": sum(stages.values()) / wall}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = build_model(gdn_1p3b(), DEV, torch.bfloat16, 0)
    model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    res: dict = {"device": torch.cuda.get_device_name(), "shape": "gdn-1.3b", "rows": []}
    for pdl in (True, False):
        with dependent_launch(pdl):
            target = GraphedTarget(model)
            row = {"dependent_launch": pdl, "ar": ar_stages(target, vocab)}
            row["replay"] = replays(target, after=False)
            row["replay_then_op"] = replays(target, after=True)
            res["rows"].append(row)
            del target
            torch.cuda.empty_cache()
    res["seconds"] = time.perf_counter() - start
    (out / "stage-clock.json").write_text(json.dumps(res, indent=1))
    lines = [f"# stage-clock: events vs wall ({res['device']}, {res['shape']}, {res['seconds']:.0f} s)", ""]
    lines += ["| dependent launch | what | events ms | wall ms | events / wall |", "|---|---|--:|--:|--:|"]
    for r in res["rows"]:
        for what in ("replay", "replay_then_op"):
            x = r[what]
            lines.append(f"| {r['dependent_launch']} | decode graph, {what} | {x['events_ms']:.3f} | "
                         f"{x['wall_ms']:.3f} | {x['ratio']:.2f} |")  # fmt: skip
        a = r["ar"]
        split = ", ".join(f"{k} {v:.3f}" for k, v in a["stages_ms"].items())
        lines.append(f"| {r['dependent_launch']} | AR generate, stages ({split}) | {a['stage_sum_ms']:.3f} | "
                     f"{a['wall_ms']:.3f} | {a['ratio']:.2f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "stage-clock.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
