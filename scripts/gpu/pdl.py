"""Programmatic dependent launch (repro.gdn.triton_common.dependent_launch) on the decode step, the verify
step and the tree kernels, A/B in one process on the H200 (issue 13: decode near the weight-bandwidth floor,
verify(64) against decode, tree verification).

    python3 scripts/gpu/pdl.py OUT_DIR      (one H200: < 150 s)

At the gdn-1.3b, qwen3.6-27b and tiny shapes (random bf16 weights, repro.bench.model.build_model), the graphed
engine's decode configuration (GEMV matmuls, separate GDN core; at 27B decode attention on the tree kernel):
a CUDA graph of REPS ``decode_pick`` steps from the empty state, captured under each variant, median us per
step over replays (alternating variants), the first step's logits compared bitwise. At gdn-1.3b and tiny also
the verify of a VERIFY_NODES-node draft tree on the same decoder (a graph of REPS verifies), and at the
SpecLA and Weaver kernel shapes (T = 128) the split and fused tree kernels alone (bf16, "tf32").
Variants (:data:`VARIANTS`): plain launches; every kernel a programmatic dependent releasing the next
launch at its start, at its exit, or "auto" (the default: at the start but in verification, at the exit;
``trigger``: an early release places the next kernel's CTAs on the SMs while this one runs).
Writes OUT_DIR/pdl.json and OUT_DIR/pdl.md; prints the markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.bench import kernel_methods as km  # noqa: E402
from repro.bench import kernels as bk  # noqa: E402
from repro.bench.model import MODEL_SHAPES, build_model, weight_bytes  # noqa: E402
from repro.bench.shapes import draft_tree  # noqa: E402
from repro.bench.timing import TimerConfig, measure_ceilings  # noqa: E402
from repro.gdn import triton_tree as tt  # noqa: E402
from repro.gdn.triton_common import dependent_launch  # noqa: E402
from repro.models.config import GDN  # noqa: E402
from repro.models.static import StaticDecoder, TreeSlot  # noqa: E402
from repro.tree import Tree  # noqa: E402

REPS = {"gdn-1.3b": 50, "qwen3.6-27b": 8, "tiny": 50}
REPLAYS = 7


def capture(
    dec: StaticDecoder, state: Any, reps: int, variant: tuple[bool, bool, str]
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


VARIANTS = {  # name: dependent_launch's (enabled, early_weights, trigger)
    "plain": (False, False, "auto"),
    "pdl_start": (True, False, "start"),
    "pdl_auto": (True, False, "auto"),
    "pdl_exit": (True, False, "exit"),
}
VERIFY_NODES = 33


def graph_of(fn: Callable[[], Any], reps: int, variant: tuple[bool, bool, str]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``reps`` calls of ``fn`` captured under ``variant`` (after a warm call on a side
    stream)."""
    with dependent_launch(*variant):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
    return graph


def timed(graphs: dict[str, torch.cuda.CUDAGraph], reps: int, before: Callable[[], None]) -> dict[str, float]:
    """Median us per call of each graph over REPLAYS replays, the variants alternating."""
    times: dict[str, list[float]] = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(REPLAYS):
        for name, graph in graphs.items():
            before()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(1e3 * start.elapsed_time(end) / reps)
    return {name: statistics.median(t) for name, t in times.items()}


def verify_rows(shape: str, model: Any, dec: StaticDecoder, state: Any, reps: int) -> list[dict[str, Any]]:
    """A VERIFY_NODES-node draft tree verified on ``dec`` under each variant (logits compared bitwise)."""
    gen = torch.Generator().manual_seed(5)
    parents = draft_tree(VERIFY_NODES, 5)
    tokens = torch.randint(0, model.config.vocab_size, (VERIFY_NODES,), generator=gen)
    tree = Tree(tokens, torch.tensor(parents))
    dec.load(state)
    slot = TreeSlot(dec, VERIFY_NODES, max_depth=int(tree.depth.max()))
    slot.set_tree(tree)
    firsts, graphs = {}, {}
    for name, variant in VARIANTS.items():
        with dependent_launch(*variant):
            firsts[name] = dec.verify(slot).clone()
        graphs[name] = graph_of(lambda: dec.verify(slot), reps, variant)
    us = timed(graphs, reps, lambda: None)
    rows = []
    for name in VARIANTS:
        same = bool(torch.equal(firsts["plain"], firsts[name]))
        rows.append(dict(shape=shape, step=f"verify({VERIFY_NODES})", variant=name, us=us[name], reps=reps,
                         replays=REPLAYS, first_step_bitwise_equal=same))  # fmt: skip
        print(f"{shape} verify {name} {us[name]:.1f} us equal={same}", flush=True)
    return rows


def shape_rows(shape: str, copy_gbps: float) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    model = build_model(MODEL_SHAPES[shape](), dev, torch.bfloat16, 0)
    model.set_gdn_backend("triton")
    floor = weight_bytes(model) / (copy_gbps * 1e3)
    attention = any(t != GDN for t in model.config.layer_types)  # 27B: decode attention on the tree kernel
    dec = StaticDecoder(model, 256, VERIFY_NODES, gemv=True, fuse_decode=False, fuse_verify=False,
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
        rows.append(dict(shape=shape, step="decode", variant=name, us=us, floor_us=floor,
                         floor_frac=floor / us, reps=reps, replays=REPLAYS, first_step_bitwise_equal=same,
                         first_step_max_diff=err))  # fmt: skip
        print(f"{shape} {name} {us:.1f} us/step ({100 * floor / us:.1f}% of floor) equal={same}", flush=True)
    del graphs
    if shape != "qwen3.6-27b":
        rows += verify_rows(shape, model, dec, state, reps)
    del dec, model
    torch.cuda.empty_cache()
    return rows


def kernel_rows() -> list[dict[str, Any]]:
    """The split and fused tree kernels alone at the SpecLA and Weaver shapes, T = 128, under each variant."""
    dev = torch.device("cuda")
    rows = []
    for shape, method in (("specla", "tree_split"), ("weaver", "tree_split"), ("weaver", "tree_fused")):
        spec = bk.RowSpec(shape, "verify", "draft", 128, method, "bf16")
        case = bk.make_case(spec, bk.BenchConfig(bf16_precision="tf32"), dev)
        x = km.make_inputs(case.shape, case.n, km.seed_of(spec, 0, "pdl"), dev).to("bf16")
        kernel = tt.tree_gdn_split if method == "tree_split" else tt.tree_gdn_fused
        args = (x.q, x.k, x.v, x.g, x.beta, x.state, case.ancestors, case.shape.scale, "tf32")
        graphs = {
            name: graph_of(lambda f=kernel, a=args: f(*a), 20, variant) for name, variant in VARIANTS.items()
        }
        us = timed(graphs, 20, lambda: None)
        for name in VARIANTS:
            rows.append(dict(shape=shape, step=f"{method} T=128", variant=name, us=us[name], reps=20,
                             replays=REPLAYS))  # fmt: skip
            print(f"{shape} {method} {name} {us[name]:.2f} us", flush=True)
    return rows


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ceilings = measure_ceilings(torch.device("cuda"), TimerConfig(warmup_ms=1.0, rep_ms=3.0))
    copy_gbps = ceilings["copy_GBps"]
    rows = []
    for part in ("kernels", "tiny", "gdn-1.3b", "qwen3.6-27b"):
        try:
            rows += kernel_rows() if part == "kernels" else shape_rows(part, copy_gbps)
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others
            rows.append(dict(shape=part, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            print(rows[-1], flush=True)
        write(out, rows, time.monotonic() - t0, copy_gbps)


def write(out: Path, rows: list[dict[str, Any]], seconds: float, copy_gbps: float) -> None:
    res = {"device": torch.cuda.get_device_name(), "seconds": seconds, "copy_gbps": copy_gbps, "rows": rows}
    (out / "pdl.json").write_text(json.dumps(res, indent=1))
    lines = [
        f"# Programmatic dependent launch: decode, verify, tree kernels ({res['device']}, {seconds:.0f} s)",
        "",
        "| shape | step | variant | us | floor us | % of floor | = plain's, bitwise |",
        "|---|---|---|--:|--:|--:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | error: {r['error']} | | | | | |")
            continue
        floor = f"{r['floor_us']:.1f} | {100 * r['floor_frac']:.1f}%" if "floor_us" in r else " | "
        lines.append(f"| {r['shape']} | {r['step']} | {r['variant']} | {r['us']:.2f} | {floor} | "
                     f"{r.get('first_step_bitwise_equal', '')} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "pdl.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
