"""Device time of the graphed target's graphs on tiny-qwen35 (CUDA events over replays) and the host
cost of a tree upload, to set beside the wall time per step of `repro run --engine graphed`.

    python3 scripts/gpu_engine_timing.py [dtype]     prints one JSON object (microseconds per call)
"""

from __future__ import annotations

import json
import sys
import time

import torch

from repro.models.graphed import GraphedTarget
from repro.models.target import open_target
from repro.tree import Tree


def per_call_us(fn, n: int = 200) -> float:  # noqa: ANN001
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def main() -> None:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    model, _ = open_target("default", dtype, "cuda")
    model.set_gdn_backend("triton")
    target = GraphedTarget(model)
    target.prepare(("closed_form", "replay", "snapshot"), (1, 3, 5, 7), 64)
    state, _ = target.prefill(list(range(100, 400)))
    out: dict[str, float] = {"decode_graph": per_call_us(target._calls[("decode",)].replay)}
    target._loaded(state.eager)
    for size in (2, 4, 8, 16, 32, 64):
        tree = Tree(torch.randint(0, 4096, (size,)), torch.arange(size) - 1)
        slot = target._slot(size, False, target.capture)
        slot.set_tree(tree, pad=True)
        out[f"verify_graph_{size}"] = per_call_us(target._calls[("verify", size, False)].replay)
        slot.set_accepted(tree.path_to(min(3, size - 1)))
        for strategy in ("closed_form", "replay"):
            with target._preserved():
                commit = target._calls[("commit", size, False, strategy)]
                out[f"commit_{strategy}_{size}"] = per_call_us(commit.replay)
        t0 = time.perf_counter()
        for _ in range(200):
            slot.set_tree(tree, pad=True)
        torch.cuda.synchronize()
        out[f"set_tree_host_{size}"] = (time.perf_counter() - t0) * 1e6 / 200
    from repro.models.graphs import GraphedCall
    from repro.models.static import StaticDecoder

    for gemv in (False, True):  # the decode step alone, fused glue on cuBLAS vs on the GEMV kernels
        dec = StaticDecoder(model, 4096, 64, gemv=gemv)
        dec.load(state.eager)
        out[f"decode_graph_gemv_{gemv}"] = per_call_us(
            GraphedCall(dec.decode_step, torch.device("cuda")).replay
        )
    logits = torch.zeros(33, 4096, device="cuda")
    t0 = time.perf_counter()
    for _ in range(200):
        int(logits[0].argmax())
    out["argmax_item_sync"] = (time.perf_counter() - t0) * 1e6 / 200
    print(json.dumps({k: round(v, 1) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
