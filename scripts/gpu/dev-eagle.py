"""GPU check of the static EAGLE drafter (branch dev-eagle): propose time, eager vs static vs graphed.

Usage: python scripts/gpu/dev-eagle.py OUT_DIR   (CUDA; bf16; well under 90 s on an H200)

For two drafters, in bf16 on the GPU, and two modes (chain k=6; SpecLA's tree: budget 32, topk 4,
tau 0.05, depth 6) it times ``propose`` of the eager EagleDrafter, the StaticEagleDrafter run eagerly
and the StaticEagleDrafter as one CUDA graph:

- ``tiny``: the embedded tiny-qwen35 target and its trained EAGLE drafter (tiny-qwen35-eagle);
- ``gdn-1.3b``: random weights at repro/bench/model.py's gdn-1.3b shape (24 layers, width 2048,
  vocabulary 32000) and a random EAGLE drafter of one Llama layer at width 2048 (16 heads x 128, as
  dev-scale's ``repro.drafters.shapes.gdn13b_eagle`` when present, else the same shape here).

The context is a prompt of ``CONTEXT`` random tokens prefilled once through HybridLM (reference GDN
backend; every chunk observed by every drafter); each timed ``propose`` alternates the pending token, so
every call recomputes one committed row and drafts the whole proposal. Times per call: the median CUDA-
event time on the stream (start recorded before, end after the call; launch gaps included) and the wall
time of ``CALLS`` back-to-back calls with one synchronize at the end. Also recorded: agreement of the
static drafters' proposals with the eager one in bf16 (chain tokens / tree nodes; bf16 may flip near-
ties), and whether ``CALLS`` graphed proposes run under ``torch.cuda.set_sync_debug_mode("error")``.
Writes OUT_DIR/dev-eagle.json and OUT_DIR/dev-eagle.md; prints the table. ``--cpu-dry-run`` (second
argument) runs the same code on the CPU in float32 at small shapes (no graphs, wall clocks): a check of
the script itself, no measurement.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from repro.bench.model import MODEL_SHAPES, build_model
from repro.drafters.base import DraftContext, Proposal
from repro.drafters.eagle import DynamicTree, EagleConfig, EagleDrafter, EagleDraftModel, load_eagle
from repro.drafters.layers import init_draft_weights
from repro.drafters.static_eagle import StaticEagleDrafter, real_nodes
from repro.models.family import drafter_name
from repro.models.hybrid import PREFILL_CHUNK, HybridLM, Verification
from repro.models.target import open_target

CALLS = int(os.environ.get("DEV_EAGLE_CALLS", 40))
WARMUP = 3
DRY = "--cpu-dry-run" in sys.argv[2:]
DEVICE = torch.device("cpu" if DRY else "cuda")
DTYPE = torch.float32 if DRY else torch.bfloat16
CONTEXT = {"tiny": 200, "gdn-1.3b": 512}
MODES: dict[str, dict[str, Any]] = {
    "chain-k6": {"k": 6},
    "specla-b32": {"tree": DynamicTree(32, topk=4, tau=0.05, depth=6)},
}


def eagle_13b(target: HybridLM) -> EagleDraftModel:
    try:
        from repro.drafters.shapes import gdn13b_eagle  # dev-scale's (when merged)

        return gdn13b_eagle(target)
    except ImportError:
        tc = target.config
        cfg = EagleConfig(
            hidden_size=tc.hidden_size, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=16,
            head_dim=128, intermediate_size=tc.intermediate_size, vocab_size=tc.vocab_size,
            target_layer_ids=[tc.num_hidden_layers - 1], target_hidden_size=tc.hidden_size,
            rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta,
        )  # fmt: skip
        return init_draft_weights(EagleDraftModel(cfg), 0).to(target.device, target.dtype).eval()


def targets() -> dict[str, tuple[HybridLM, EagleDraftModel]]:
    tiny, _ = open_target("default", dtype=str(DTYPE).removeprefix("torch."), device=DEVICE.type)
    tiny_eagle = load_eagle(drafter_name("tiny-qwen35", "eagle"), DTYPE, DEVICE, target=tiny)
    big = build_model(MODEL_SHAPES["tiny" if DRY else "gdn-1.3b"](), DEVICE, DTYPE, seed=0)
    return {"tiny": (tiny, tiny_eagle), "gdn-1.3b": (big, eagle_13b(big))}


def drafters(target: HybridLM, model: EagleDraftModel, mode: dict[str, Any]) -> dict[str, EagleDrafter]:
    return {
        "eager": EagleDrafter(model, target, **mode),
        "static": StaticEagleDrafter(model, target, graphs=False, capacity=1024, **mode),
        "graphed": StaticEagleDrafter(model, target, graphs=not DRY, capacity=1024, **mode),
    }


@torch.no_grad()
def prefill(target: HybridLM, ids: list[int], layers: tuple[int, ...]) -> list[Verification]:
    """The verifications of the prompt's prefill chunks (the reference GDN backend: no kernel compiles)."""
    state, vers = None, []
    for start in range(0, len(ids), PREFILL_CHUNK):
        state, ver = target.prefill(ids[start : start + PREFILL_CHUNK], state, layers)
        vers.append(ver)
    return vers


def key(drafter: EagleDrafter, p: Proposal) -> tuple:
    """What a proposal drafts: chain tokens per depth, or the tree's real nodes."""
    if drafter.tree is None:
        return tuple(map(tuple, p.candidates))
    tree = p.tree.to_tree() if hasattr(p.tree, "to_tree") else p.tree
    tree = real_nodes(tree)
    return tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())


class _Clock:
    """A CUDA event, or the wall clock in a CPU dry run."""

    def __init__(self) -> None:
        self.event = None if DRY else torch.cuda.Event(enable_timing=True)
        self.t = 0.0

    def record(self) -> None:
        if self.event is None:
            self.t = time.perf_counter()
        else:
            self.event.record()

    def ms_to(self, end: _Clock) -> float:
        return 1e3 * (end.t - self.t) if self.event is None else self.event.elapsed_time(end.event)


def _sync() -> None:
    if not DRY:
        torch.cuda.synchronize()


def time_calls(drafter: EagleDrafter, ctxs: list[DraftContext]) -> dict[str, float]:
    for ctx in ctxs[:WARMUP]:
        drafter.propose(ctx)
    _sync()
    clocks = [(_Clock(), _Clock()) for _ in ctxs]
    t0 = time.perf_counter()
    for ctx, (start, end) in zip(ctxs, clocks):
        start.record()
        drafter.propose(ctx)
        end.record()
    _sync()
    wall = (time.perf_counter() - t0) / len(ctxs)
    gpu = [s.ms_to(e) for s, e in clocks]
    return {
        "event_ms_median": statistics.median(gpu),
        "event_ms_min": min(gpu),
        "wall_ms_per_call": 1e3 * wall,
    }


def sync_free(drafter: EagleDrafter, ctxs: list[DraftContext]) -> str:
    if DRY:
        return "not checked (CPU)"
    drafter.propose(ctxs[0])  # captured already; one more call outside the check
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ctx in ctxs:
            drafter.propose(ctx)
        return "yes"
    except RuntimeError as exc:
        return f"no: {str(exc).splitlines()[0][:160]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main(out: Path) -> None:
    if not DRY and not torch.cuda.is_available():
        sys.exit("dev-eagle.py needs a CUDA GPU (or --cpu-dry-run)")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    rows, checks = [], []
    gen = torch.Generator().manual_seed(0)
    for shape, (target, model) in targets().items():
        vocab = target.config.vocab_size
        ids = torch.randint(5, vocab, (CONTEXT[shape],), generator=gen).tolist()
        pending = torch.randint(5, vocab, (2,), generator=gen).tolist()
        ctxs = [DraftContext(ids, [pending[i % 2]]) for i in range(CALLS)]
        vers = prefill(target, ids, tuple(model.config.target_layer_ids))
        for mode_name, mode in MODES.items():
            ds = drafters(target, model, mode)
            for d in ds.values():
                d.begin(ids, None)
                for ver in vers:
                    d.observe_prefill(ver)
            agree = {name: 0 for name in ("static", "graphed")}
            compared = ctxs[:8]
            for ctx in compared:
                ref = key(ds["eager"], ds["eager"].propose(ctx))
                for name in agree:
                    agree[name] += key(ds[name], ds[name].propose(ctx)) == ref
            for name, d in ds.items():
                rows.append({"shape": shape, "mode": mode_name, "drafter": name, **time_calls(d, ctxs)})
                print(json.dumps(rows[-1]), flush=True)
            free = sync_free(ds["graphed"], ctxs)
            checks.append({
                "shape": shape, "mode": mode_name, "static_equal": f"{agree['static']}/{len(compared)}",
                "graphed_equal": f"{agree['graphed']}/{len(compared)}", "graphed_propose_sync_free": free,
            })  # fmt: skip
            print(json.dumps(checks[-1]), flush=True)
    result = {
        "script": "scripts/gpu/dev-eagle.py",
        "device": "cpu (dry run)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(DTYPE).removeprefix("torch."),
        "calls": CALLS,
        "context": CONTEXT,
        "modes": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in MODES.items()},
        "rows": rows,
        "checks": checks,
        "seconds": time.perf_counter() - t_start,
    }
    (out / "dev-eagle.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"# dev-eagle: EAGLE propose, eager vs static vs graphed ({result['dtype']})",
        "",
        f"{result['device']}, torch {result['torch']}; {CALLS} calls per row, context {CONTEXT} tokens.",
        "",
        "| shape | mode | drafter | event ms (median) | wall ms/call | speedup vs eager (event) |",
        "|---|---|---|---|---|---|",
    ]
    base = {(r["shape"], r["mode"]): r["event_ms_median"] for r in rows if r["drafter"] == "eager"}
    for r in rows:
        x = base[(r["shape"], r["mode"])] / r["event_ms_median"]
        md.append(
            f"| {r['shape']} | {r['mode']} | {r['drafter']} | {r['event_ms_median']:.3f} | "
            f"{r['wall_ms_per_call']:.3f} | {x:.1f}x |"
        )
    md += [
        "",
        "| shape | mode | static = eager | graphed = eager | graphed propose sync-free |",
    ]
    md += ["|---|---|---|---|---|"]
    for c in checks:
        md.append(
            f"| {c['shape']} | {c['mode']} | {c['static_equal']} | {c['graphed_equal']} | "
            f"{c['graphed_propose_sync_free']} |"
        )
    (out / "dev-eagle.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"done in {result['seconds']:.1f} s -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python scripts/gpu/dev-eagle.py OUT_DIR [--cpu-dry-run]")
    main(Path(sys.argv[1]))
