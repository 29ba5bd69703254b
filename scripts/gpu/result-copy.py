"""What a pipelined step's result read costs the device around its graph (one H200).

    python3 scripts/gpu/result-copy.py OUT_DIR

A pipelined DDTree / chain DFlash step is one graph replay, then the copy of its small int64 result to a
pinned host buffer (an event behind it), and the host reads the step before the last one (waits for its
event). Its wall time exceeds the graph's busy time by ~30 us a step (~10%) whether the step is one graph or
three (``scripts/gpu/graph-boundaries.py``; ``results/2026-12-05-h200-step-graph``). This times, on a graph of
KERNELS small kernels (~a tiny-family DDTree step's device time), us per iteration, median of TRIALS:

- ``graph``: the replay alone;
- ``graph_copy``: + the result's non-blocking copy to pinned memory;
- ``graph_copy_event``: + an event recorded behind the copy;
- ``graph_copy_in_graph``: the copy captured inside the graph (a memcpy node), an event behind the replay;
- ``graph_host_write``: no copy and no event: a last kernel in the graph stores the result straight into
  the pinned host buffer (mapped memory, UVA), as a read without the copy engine would;
- ``pipelined_read``: ``graph_copy_event`` with the host waiting each iteration for the event of the one
  before (the pipelined loop's read), plus HOST_US of host work a step (a busy-wait, the loop's Python).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro
from repro.models.graphs import GraphedCall  # noqa: E402

KERNELS = 140  # ~0.3 ms a graph: a tiny-family DDTree step
ITERS = 300
TRIALS = 7
HOST_US = (0, 150, 250)


@triton.jit
def _to_host(src, dst, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(256, device="cuda")
    result = torch.zeros(40, dtype=torch.long, device="cuda")
    hosts = [torch.zeros(40, dtype=torch.long, pin_memory=True) for _ in range(2)]

    def part() -> None:
        for _ in range(KERNELS):
            x.mul_(1.0000001).add_(1e-7)
        result.add_(1)

    def capture(fn) -> torch.cuda.CUDAGraph:  # noqa: ANN001 - the engine's capture, one warm-up call
        return GraphedCall(fn, torch.device("cuda"), warmup=1).graph

    g = capture(part)
    try:  # the pinned buffer's address is valid on the device (UVA)
        gw = capture(lambda: (part(), _to_host[(1,)](result, hosts[0], 40, BLOCK=64)))
    except Exception as exc:  # noqa: BLE001 - a refusal is a result too
        gw, refused = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    gc = capture(lambda: (part(), hosts[0].copy_(result, non_blocking=True)))
    stream = torch.cuda.current_stream()

    def run(step, paced_us: int | None = None) -> float:  # noqa: ANN001
        events: list = []
        for _ in range(10):
            step(events)
        torch.cuda.synchronize()
        events.clear()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        for _ in range(ITERS):
            step(events)
            if paced_us is not None:
                if len(events) >= 2:
                    events[-2].synchronize()  # the read of the step before
                t = time.perf_counter()
                while (time.perf_counter() - t) * 1e6 < paced_us:
                    pass
        b.record(stream)
        b.synchronize()
        return a.elapsed_time(b) * 1000 / ITERS

    def graph(events: list) -> None:
        g.replay()

    def graph_copy(events: list) -> None:
        g.replay()
        hosts[len(events) % 2].copy_(result, non_blocking=True)

    def graph_copy_event(events: list) -> None:
        g.replay()
        hosts[len(events) % 2].copy_(result, non_blocking=True)
        e = torch.cuda.Event()
        e.record(stream)
        events.append(e)

    def in_graph(events: list) -> None:
        gc.replay()
        e = torch.cuda.Event()
        e.record(stream)
        events.append(e)

    def host_write(events: list) -> None:
        gw.replay()

    rows: dict = {}
    cases = [("graph", graph), ("graph_copy", graph_copy), ("graph_copy_event", graph_copy_event),
             ("graph_copy_in_graph", in_graph)]  # fmt: skip
    cases += [("graph_host_write", host_write)] if gw is not None else []
    for name, fn in cases:
        rows[name] = statistics.median(run(fn) for _ in range(TRIALS))
    if gw is not None:
        gw.replay()
        torch.cuda.synchronize()
        assert torch.equal(hosts[0], result.cpu()), "the kernel's store to pinned memory did not land"
    else:
        rows["graph_host_write"] = refused
    for us in HOST_US:
        timed = [run(graph_copy_event, us) for _ in range(TRIALS)]
        rows[f"pipelined_read_host{us}us"] = statistics.median(timed)
    name = torch.cuda.get_device_name()
    lines = [f"# result copy on {name}: {KERNELS} kernels a graph, {ITERS} iterations, median of {TRIALS}",
             "", "| pattern | us / iteration |", "|---|--:|",
             *[f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |"
               for k, v in rows.items()]]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    (out / "result-copy.md").write_text(text + "\n")
    (out / "result-copy.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
