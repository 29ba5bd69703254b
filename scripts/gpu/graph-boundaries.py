"""What a CUDA-graph boundary and an event record node inside a graph cost the device (one H200).

    python3 scripts/gpu/graph-boundaries.py OUT_DIR

A pipelined DDTree / chain DFlash step replays two or three graphs (the drafter's, the tree's, then verify
+ acceptance + commit) between the engine's stage marks; its wall time exceeds the graphs' busy time by
~10%. Beside a step made one graph (tried and reverted: results/2026-12-05-h200-step-graph), this times the
patterns on small kernels (KERNELS elementwise launches a part, the size of the tiny family's launches), us
per iteration, median of TRIALS:

- ``two_graphs``: part A's graph, then part B's;
- ``one_graph``: A and B captured as one graph;
- ``one_graph_event``: the same with an external event recorded between A and B inside the graph (the
  in-graph mark that splits a merged step's time between its draft and verify stages);
- ``*_clocked``: each with the engine's pattern of events around it (a stage mark before and after each
  part or graph, two events around each replay), as ``StageClock`` and ``busy_recorder`` record them.

It also checks that the in-graph event reads: elapsed time from the replay's start event to the in-graph
event, and from it to the end event, both positive and summing to the whole.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro
from repro.models.graphs import GraphedCall  # noqa: E402

KERNELS = 24
ITERS = 400
TRIALS = 7


def part(x: torch.Tensor) -> None:
    for _ in range(KERNELS):
        x.mul_(1.0000001).add_(1e-7)


def capture(fn) -> torch.cuda.CUDAGraph:  # noqa: ANN001 - a zero-argument callable
    """The CUDA graph of ``fn`` as the engine captures it (one warm-up call on a side stream first)."""
    return GraphedCall(fn, torch.device("cuda"), warmup=1).graph


def timed(step, clocked: bool, pool: list) -> float:  # noqa: ANN001
    """us per iteration of ``step(mark)`` (``mark``: records a stage-mark event when ``clocked``)."""
    stream = torch.cuda.current_stream()

    def mark() -> None:
        if clocked:
            pool.append(torch.cuda.Event(enable_timing=True))
            pool[-1].record(stream)

    for _ in range(20):
        step(mark)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record(stream)
    for _ in range(ITERS):
        step(mark)
    end.record(stream)
    end.synchronize()
    pool.clear()
    return begin.elapsed_time(end) * 1000.0 / ITERS


def replay(g: torch.cuda.CUDAGraph, clocked: bool, pool: list) -> None:
    if not clocked:
        g.replay()
        return
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    pool += (a, b)
    a.record()
    g.replay()
    b.record()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(256, device="cuda")
    y = torch.zeros(256, device="cuda")
    mid = torch.cuda.Event(enable_timing=True, external=True)
    ga, gb = capture(lambda: part(x)), capture(lambda: part(y))
    gab = capture(lambda: (part(x), part(y)))

    def with_event() -> None:
        part(x)
        mid.record()
        part(y)

    gev = capture(with_event)
    pool: list = []

    def two(mark, clocked=False) -> None:  # noqa: ANN001
        mark()
        replay(ga, clocked, pool)
        mark()
        replay(gb, clocked, pool)
        mark()

    def one(g):  # noqa: ANN001, ANN202
        def step(mark, clocked=False) -> None:  # noqa: ANN001
            mark()
            mark()
            replay(g, clocked, pool)
            mark()

        return step

    cases = {
        "two_graphs": two,
        "one_graph": one(gab),
        "one_graph_event": one(gev),
    }
    rows = {}
    for name, step in cases.items():
        for clocked in (False, True):
            key = name + ("_clocked" if clocked else "")
            fn = lambda m, s=step, c=clocked: s(m, c)  # noqa: E731
            rows[key] = statistics.median(timed(fn, clocked, pool) for _ in range(TRIALS))
    # the in-graph event reads against the replay's own events
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    gev.replay()
    b.record()
    b.synchronize()
    split = {"start_to_mid_us": a.elapsed_time(mid) * 1000, "mid_to_end_us": mid.elapsed_time(b) * 1000,
             "start_to_end_us": a.elapsed_time(b) * 1000}  # fmt: skip
    single = statistics.median(timed(lambda m: ga.replay(), False, pool) for _ in range(TRIALS))
    lines = [
        f"# graph boundaries on {torch.cuda.get_device_name()} (torch {torch.__version__}): "
        f"{KERNELS} kernels a part, {ITERS} iterations, median of {TRIALS}",
        "",
        "| pattern | us / iteration |",
        "|---|--:|",
        *[f"| {k} | {v:.2f} |" for k, v in rows.items()],
        f"| one part alone (one graph of {KERNELS} kernels) | {single:.2f} |",
        "",
        "In-graph event read: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()),
    ]
    text = "\n".join(lines)
    print(text)
    (out / "graph-boundaries.md").write_text(text + "\n")
    (out / "graph-boundaries.json").write_text(json.dumps({"rows": rows, "split": split, "single": single}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
