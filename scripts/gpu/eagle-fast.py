"""GPU check and timing of the static EAGLE drafter's fast forward (branch eagle-fast).

Usage: python scripts/gpu/eagle-fast.py OUT_DIR [--cpu-dry-run]   (CUDA; well under 90 s on an H200)

Checks (the tiny family: the embedded tiny-qwen35 target and its trained EAGLE drafter; a prompt of
``CONTEXT`` random tokens prefilled once, then ``CHECKS`` proposals with other pending tokens):

- float32, CUDA graphs: ``StaticEagleDrafter(fast=True)`` against the eager ``EagleDrafter``: the same
  chain tokens / tree nodes (expected: every proposal), the chain distributions' largest relative error
  (expected <= 1e-5);
- bf16, CUDA graphs (the timed drafters, before timing): the fast drafter against the current static
  drafter (``fast=False``): proposals that agree (bf16 may flip near-ties) and the chain distributions'
  largest absolute difference.

Timing (bf16, CUDA graphs, fast vs current; for the tree mode also the fast forward with the tree glue
before 2026-12-02, ``legacy_glue``, checked against the new glue first), one proposal (chain k = 6;
SpecLA's tree: budget 32, topk 4, tau 0.05, depth 6) at two shapes: ``tiny`` (above) and ``gdn-1.3b``
(random weights: the EAGLE drafter
at the GDN-1.3B shape, ``repro.drafters.shapes.gdn13b_eagle``: one layer at width 2048, 16 heads of 128,
intermediate 5632, vocabulary 32000, on a 2-layer random target of that shape: the drafter reads only the
last layer's features, the embedding, the final norm and the LM head). Per row: the median CUDA-event
time of ``propose`` (host uploads and launch gaps included), the wall time of ``CALLS`` back-to-back
proposes with one synchronize, and the graph's replay alone (events around ``CALLS`` replays). Writes
OUT_DIR/eagle-fast.json and OUT_DIR/eagle-fast.md and prints the table. ``--cpu-dry-run`` runs the tiny
rows on the CPU through Triton's interpreter (float32 / float64, no graphs, few calls): a check of the
script, no measurement.
"""

from __future__ import annotations

import os
import sys

DRY = "--cpu-dry-run" in sys.argv[2:]
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from repro.bench.model import MODEL_SHAPES, build_model  # noqa: E402
from repro.drafters.base import DraftContext, Proposal  # noqa: E402
from repro.drafters.eagle import DynamicTree, EagleDrafter, EagleDraftModel, load_eagle  # noqa: E402
from repro.drafters.shapes import gdn13b_eagle  # noqa: E402
from repro.drafters.static_eagle import StaticEagleDrafter, real_nodes  # noqa: E402
from repro.models.family import drafter_name  # noqa: E402
from repro.models.hybrid import PREFILL_CHUNK, HybridLM, Verification  # noqa: E402
from repro.models.target import open_target  # noqa: E402

CALLS = 3 if DRY else int(os.environ.get("EAGLE_FAST_CALLS", 40))
CHECKS = 2 if DRY else 8
WARMUP = 1 if DRY else 3
DEVICE = torch.device("cpu" if DRY else "cuda")
TIME_DTYPE = torch.float32 if DRY else torch.bfloat16
CONTEXT = {"tiny": 40 if DRY else 200, "gdn-1.3b": 512}
MODES: dict[str, dict[str, Any]] = {
    "chain-k6": {"k": 6},
    "specla-b32": {"tree": DynamicTree(32, topk=4, tau=0.05, depth=6)},
}


def tiny(dtype: torch.dtype) -> tuple[HybridLM, EagleDraftModel]:
    target, _ = open_target("default", dtype=str(dtype).removeprefix("torch."), device=DEVICE.type)
    return target, load_eagle(drafter_name("tiny-qwen35", "eagle"), dtype, DEVICE, target=target)


def gdn13b(dtype: torch.dtype) -> tuple[HybridLM, EagleDraftModel]:
    cfg = MODEL_SHAPES["gdn-1.3b"]()
    target = build_model(dataclasses.replace(cfg, layer_types=cfg.layer_types[:2]), DEVICE, dtype, seed=0)
    return target, gdn13b_eagle(target)


@torch.no_grad()
def prefilled(target: HybridLM, ids: list[int], drafters: list[EagleDrafter]) -> None:
    """Prefill ``ids`` (chunk by chunk) and let every drafter observe it."""
    layers = drafters[0].capture_layers
    vers: list[Verification] = []
    state = None
    for start in range(0, len(ids), PREFILL_CHUNK):
        state, ver = target.prefill(ids[start : start + PREFILL_CHUNK], state, layers)
        vers.append(ver)
    for d in drafters:
        d.begin(ids, None)
        for ver in vers:
            d.observe_prefill(ver)


def contexts(vocab: int, length: int, count: int, seed: int = 0) -> list[DraftContext]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (length,), generator=gen).tolist()
    pending = torch.randint(5, vocab, (count,), generator=gen).tolist()
    return [DraftContext(ids, [p]) for p in pending]


def drafted(drafter: EagleDrafter, p: Proposal) -> tuple:
    """What a proposal drafts: chain tokens per depth, or the tree's real nodes."""
    if drafter.tree is None:
        return tuple(map(tuple, p.candidates))
    tree = p.tree.to_tree() if hasattr(p.tree, "to_tree") else p.tree
    tree = real_nodes(tree)
    return tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())


def static(
    model: EagleDraftModel, target: HybridLM, fast: bool, mode: dict[str, Any], legacy_glue: bool = False
) -> StaticEagleDrafter:
    return StaticEagleDrafter(
        model, target, graphs=not DRY, capacity=1024, fast=fast, legacy_glue=legacy_glue, **mode
    )


def compare(ref_drafter: EagleDrafter, drafter: EagleDrafter, ctxs: list[DraftContext]) -> dict[str, Any]:
    """Proposals of ``drafter`` against ``ref_drafter``'s on the same contexts."""
    same, rel_err, abs_err = 0, 0.0, 0.0
    for ctx in ctxs:
        ref, got = ref_drafter.propose(ctx), drafter.propose(ctx)
        same += drafted(ref_drafter, ref) == drafted(drafter, got)
        if drafter.tree is None:
            a, b = got.probs.double().cpu(), ref.probs.double().cpu()
            rel_err = max(rel_err, float((a - b).norm() / b.norm()))
            abs_err = max(abs_err, float((a - b).abs().max()))
    return {"same": f"{same}/{len(ctxs)}", "probs_rel_err": rel_err, "probs_abs_err": abs_err}


def checks() -> list[dict[str, Any]]:
    """float32 (float64 in a dry run) at the tiny family: the fast drafter against the eager EagleDrafter."""
    out = []
    dtype = torch.float64 if DRY else torch.float32
    target, model = tiny(dtype)
    ctxs = contexts(target.config.vocab_size, CONTEXT["tiny"], CHECKS)
    for mode_name, mode in MODES.items():
        fast, ref = static(model, target, True, mode), EagleDrafter(model, target, **mode)
        prefilled(target, ctxs[0].prompt_ids, [ref, fast])
        out.append({"dtype": str(dtype)[6:], "mode": mode_name, "reference": "eager EagleDrafter"})
        out[-1].update(compare(ref, fast, ctxs))
        print(json.dumps(out[-1]), flush=True)
    return out


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


def time_drafter(drafter: StaticEagleDrafter, ctxs: list[DraftContext]) -> dict[str, float]:
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
    events = [s.ms_to(e) for s, e in clocks]
    row = {"event_ms_median": statistics.median(events), "wall_ms_per_call": 1e3 * wall}
    if drafter._call is not None:  # the graph's replays alone
        start, end = _Clock(), _Clock()
        start.record()
        for _ in range(CALLS):
            drafter._call.replay()
        end.record()
        _sync()
        row["replay_ms"] = start.ms_to(end) / CALLS
    return row


def timings(checked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fast vs current per shape and mode; at the tiny shape also their proposals compared (into
    ``checked``)."""
    rows = []
    shapes = {"tiny": tiny} if DRY else {"tiny": tiny, "gdn-1.3b": gdn13b}
    for shape, build in shapes.items():
        target, model = build(TIME_DTYPE)
        ctxs = contexts(target.config.vocab_size, CONTEXT[shape], CALLS)
        for mode_name, mode in MODES.items():
            ds = {name: static(model, target, name == "fast", mode) for name in ("current", "fast")}
            if "tree" in mode:  # the tree glue before 2026-12-02 (157 launches a proposal, now 67)
                ds["fast_legacy_glue"] = static(model, target, True, mode, legacy_glue=True)
            prefilled(target, ctxs[0].prompt_ids, list(ds.values()))
            if shape == "tiny":
                row = {"dtype": str(TIME_DTYPE)[6:], "mode": mode_name, "reference": "static, fast=False"}
                checked.append({**row, **compare(ds["current"], ds["fast"], ctxs[:CHECKS])})
                print(json.dumps(checked[-1]), flush=True)
                if "fast_legacy_glue" in ds:  # the same forward: the two glues must give the same trees
                    row = {**row, "reference": "fast, legacy tree glue"}
                    checked.append({**row, **compare(ds["fast_legacy_glue"], ds["fast"], ctxs[:CHECKS])})
                    print(json.dumps(checked[-1]), flush=True)
            for name, d in ds.items():
                rows.append({"shape": shape, "mode": mode_name, "path": name, **time_drafter(d, ctxs)})
                print(json.dumps(rows[-1]), flush=True)
        del target, model
    return rows


def markdown(result: dict[str, Any]) -> str:
    md = [
        f"# eagle-fast: the static EAGLE drafter's fast forward ({result['dtype']}, CUDA graphs)",
        "",
        f"{result['device']}, torch {result['torch']}; {CALLS} proposals a row; context {CONTEXT} tokens.",
        "",
        "| shape | mode | path | propose ms (event median) | wall ms/call | replay ms | speedup (event) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = result["timings"]
    base = {(r["shape"], r["mode"]): r["event_ms_median"] for r in rows if r["path"] == "current"}
    for r in rows:
        x = base[(r["shape"], r["mode"])] / r["event_ms_median"]
        replay = f"{r['replay_ms']:.3f}" if "replay_ms" in r else "-"
        md.append(
            f"| {r['shape']} | {r['mode']} | {r['path']} | {r['event_ms_median']:.3f} | "
            f"{r['wall_ms_per_call']:.3f} | {replay} | {x:.2f}x |"
        )
    md += ["", "| dtype | mode | reference | same proposals | chain probs rel err | abs err |"]
    md += ["|---|---|---|---|---|---|"]
    for c in result["checks"]:
        md.append(
            f"| {c['dtype']} | {c['mode']} | {c['reference']} | {c['same']} | {c['probs_rel_err']:.2e} | "
            f"{c['probs_abs_err']:.2e} |"
        )
    return "\n".join(md) + "\n"


def main(out: Path) -> None:
    if not DRY and not torch.cuda.is_available():
        sys.exit("eagle-fast.py needs a CUDA GPU (or --cpu-dry-run)")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    torch.manual_seed(0)
    result: dict[str, Any] = {
        "script": "scripts/gpu/eagle-fast.py",
        "device": "cpu (dry run, Triton interpreter)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(TIME_DTYPE).removeprefix("torch."),
        "calls": CALLS,
        "context": CONTEXT,
        "modes": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in MODES.items()},
        "checks": checks(),
    }
    result["timings"] = timings(result["checks"])
    result["seconds"] = time.perf_counter() - t_start
    (out / "eagle-fast.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out / "eagle-fast.md").write_text(md)
    print(md)
    print(f"done in {result['seconds']:.1f} s -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python scripts/gpu/eagle-fast.py OUT_DIR [--cpu-dry-run]")
    main(Path(sys.argv[1]))
