"""Programmatic dependent launch of the decode kernels (repro.gdn.triton_common.dependent_launch) on the
decode step, A/B in one process on the H200 (issue 13, item 4: decode near the weight-bandwidth floor).

    python3 scripts/gpu/pdl.py OUT_DIR      (one H200: < 90 s)

At the gdn-1.3b and qwen3.6-27b shapes (random bf16 weights, repro.bench.model.build_model), the graphed
engine's decode configuration (GEMV matmuls, separate GDN core; at 27B decode attention on the tree kernel):
a CUDA graph of REPS ``decode_pick`` steps from the empty state, captured with and without
``dependent_launch``, median us per step over replays (alternating A/B), the first step's logits compared
bitwise; variants (:data:`VARIANTS`): plain launches, every kernel a programmatic dependent, and that
with the GEMVs loading their first weight tiles before the wait.
Writes OUT_DIR/pdl.json and OUT_DIR/pdl.md; prints the markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench.model import MODEL_SHAPES, build_model, weight_bytes  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.gdn.triton_common import dependent_launch  # noqa: E402
from repro.models.config import GDN  # noqa: E402
from repro.models.static import StaticDecoder  # noqa: E402

REPS = {"gdn-1.3b": 50, "qwen3.6-27b": 8}
REPLAYS = 7


def capture(
    dec: StaticDecoder, state: Any, reps: int, variant: tuple[bool, bool]
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    with dependent_launch(*variant):
        dec.load(state)
        dec.set_token(7)
        first = dec.decode_pick().clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dec.decode_pick()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                dec.decode_pick()
    return graph, first


def replay_us(dec: StaticDecoder, state: Any, graph: torch.cuda.CUDAGraph, reps: int) -> float:
    dec.load(state)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


VARIANTS = {  # name: dependent_launch's (enabled, early_weights)
    "plain": (False, False),
    "pdl": (True, False),
    "pdl_early_weights": (True, True),
}


def shape_rows(shape: str, copy_gbps: float) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    model = build_model(MODEL_SHAPES[shape](), dev, torch.bfloat16, 0)
    model.set_gdn_backend("triton")
    floor = weight_bytes(model) / (copy_gbps * 1e3)
    attention = any(t != GDN for t in model.config.layer_types)  # 27B: decode attention on the tree kernel
    dec = StaticDecoder(model, 256, 4, gemv=True, fuse_decode=False, fuse_verify=False,
                        tree_attention_decode=attention)  # fmt: skip
    state = dec.export()
    reps = REPS[shape]
    graphs, firsts = {}, {}
    for name, variant in VARIANTS.items():
        graphs[name], firsts[name] = capture(dec, state, reps, variant)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(REPLAYS):
        for name in VARIANTS:
            times[name].append(replay_us(dec, state, graphs[name], reps))
    rows = []
    for name in VARIANTS:
        us = statistics.median(times[name])
        same = bool(torch.equal(firsts["plain"], firsts[name]))
        err = float((firsts["plain"].float() - firsts[name].float()).abs().max())
        rows.append(dict(shape=shape, variant=name, us=us, floor_us=floor, floor_frac=floor / us,
                         reps=reps, replays=REPLAYS, first_step_bitwise_equal=same,
                         first_step_max_diff=err))  # fmt: skip
        print(f"{shape} {name} {us:.1f} us/step ({100 * floor / us:.1f}% of floor) equal={same}", flush=True)
    del dec, model, graphs
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ceilings = measure_ceilings(torch.device("cuda"), TimerConfig(warmup_ms=1.0, rep_ms=3.0))
    copy_gbps = ceilings["copy_GBps"]
    rows = []
    for shape in ("gdn-1.3b", "qwen3.6-27b"):
        try:
            rows += shape_rows(shape, copy_gbps)
        except Exception as exc:  # noqa: BLE001 - one shape failing must not lose the other
            rows.append(dict(shape=shape, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            print(rows[-1], flush=True)
    res = {"device": torch.cuda.get_device_name(), "seconds": time.monotonic() - t0, "copy_gbps": copy_gbps,
           "rows": rows}  # fmt: skip
    (out / "pdl.json").write_text(json.dumps(res, indent=1))
    lines = [
        f"# Programmatic dependent launch, decode step ({res['device']}, {res['seconds']:.0f} s)",
        "",
        "| shape | variant | us/step | floor us | % of floor | first step = plain's, bitwise (max diff) |",
        "|---|---|--:|--:|--:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | error: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['shape']} | {r['variant']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
                     f"{100 * r['floor_frac']:.1f}% | {r['first_step_bitwise_equal']} "
                     f"({r['first_step_max_diff']:.2g}) |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "pdl.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
