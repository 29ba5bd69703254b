"""GPU check and timing of the static EAGLE drafter's tree glue (branch eagle-glue): ``TreeGrowth`` vs the
legacy glue (``StaticEagleDrafter(legacy_glue=True)``), both on the fast forward with CUDA graphs.

Usage: PYTHONPATH=. python scripts/gpu/eagle-glue.py OUT_DIR [--cpu-dry-run]   (CUDA; < 90 s on an H200)

Checks (the tiny family: the embedded tiny-qwen35 target and its trained EAGLE drafter; a prompt of
``CONTEXT`` random tokens prefilled once, then ``CHECKS`` proposals with other pending tokens; SpecLA's tree:
budget 32, topk 4, tau 0.05, depth 6):

- float32, CUDA graphs: the new glue's call outputs (tokens, parents, float64 scores) against the legacy
  glue's (expected: identical, every proposal) and its trees against the eager ``EagleDrafter``'s
  (expected: every proposal);
- bf16 (the timed drafters, before timing): new vs legacy glue outputs (expected identical: the glue is
  exact and the forwards are the same kernels).

Timing (bf16, CUDA graphs, fast forward), one SpecLA proposal at two shapes: ``tiny`` and ``gdn-1.3b``
(random weights: ``repro.drafters.shapes.gdn13b_eagle`` on a 2-layer random target of the GDN-1.3B shape).
Per row: the median CUDA-event time of ``propose``, the wall time per call of ``CALLS`` back-to-back
proposes, the graph's replay alone, and the call's aten ops that launch work (``count_ops`` of one eager
call; the forward's Triton launches, 5 a level, come on top; a dry run counts the interpreter's ops too).
Writes OUT_DIR/eagle-glue.json and OUT_DIR/eagle-glue.md and prints the table (speedup: legacy / new
replay time). ``--cpu-dry-run``: the tiny rows on the CPU through Triton's interpreter (float64 / float32,
no graphs, few calls): a check of the script, no measurement.
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
from repro.drafters.base import DraftContext  # noqa: E402
from repro.drafters.eagle import DynamicTree, EagleDrafter, EagleDraftModel, load_eagle  # noqa: E402
from repro.drafters.shapes import gdn13b_eagle  # noqa: E402
from repro.drafters.static_eagle import StaticEagleDrafter, real_nodes  # noqa: E402
from repro.models.family import drafter_name  # noqa: E402
from repro.models.graphs import count_ops  # noqa: E402
from repro.models.hybrid import PREFILL_CHUNK, HybridLM, Verification  # noqa: E402
from repro.models.target import open_target  # noqa: E402

CALLS = 3 if DRY else int(os.environ.get("EAGLE_GLUE_CALLS", 50))
CHECKS = 2 if DRY else 8
WARMUP = 1 if DRY else 3
DEVICE = torch.device("cpu" if DRY else "cuda")
TIME_DTYPE = torch.float32 if DRY else torch.bfloat16
CONTEXT = {"tiny": 40 if DRY else 200, "gdn-1.3b": 512}
SPEC = DynamicTree(32, topk=4, tau=0.05, depth=6)
PATHS = ("legacy", "new")


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


def static(model: EagleDraftModel, target: HybridLM, path: str) -> StaticEagleDrafter:
    return StaticEagleDrafter(
        model, target, tree=SPEC, graphs=not DRY, capacity=1024, fast=True, legacy_glue=path == "legacy"
    )


def outputs(d: StaticEagleDrafter, ctx: DraftContext) -> tuple[list, ...]:
    """The call's (tokens, parents, scores) of a proposal on ``ctx``."""
    d.propose(ctx)
    out = d._call.output if d._call is not None else d._step()  # the call is idempotent
    return tuple(t.tolist() for t in out)


def tree_of(p: Any) -> tuple:
    tree = real_nodes(p.tree.to_tree() if hasattr(p.tree, "to_tree") else p.tree)
    return tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())


def compare(ds: dict[str, StaticEagleDrafter], ctxs: list[DraftContext], eager: EagleDrafter | None) -> dict:
    """New vs legacy glue outputs on the same contexts (and the new trees vs ``eager``'s)."""
    same = same_eager = 0
    for ctx in ctxs:
        same += outputs(ds["legacy"], ctx) == outputs(ds["new"], ctx)
        if eager is not None:
            same_eager += tree_of(eager.propose(ctx)) == tree_of(ds["new"].propose(ctx))
    out = {"same_as_legacy": f"{same}/{len(ctxs)}"}
    if eager is not None:
        out["same_as_eager"] = f"{same_eager}/{len(ctxs)}"
    return out


def checks() -> list[dict[str, Any]]:
    """float32 (float64 in a dry run) at the tiny family: new vs legacy glue and vs the eager drafter."""
    dtype = torch.float64 if DRY else torch.float32
    target, model = tiny(dtype)
    ctxs = contexts(target.config.vocab_size, CONTEXT["tiny"], CHECKS)
    ds = {p: static(model, target, p) for p in PATHS}
    eager = EagleDrafter(model, target, tree=SPEC)
    prefilled(target, ctxs[0].prompt_ids, [eager, *ds.values()])
    row = {"dtype": str(dtype)[6:], **compare(ds, ctxs, eager)}
    print(json.dumps(row), flush=True)
    return [row]


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
    row = {"event_us_median": 1e3 * statistics.median(s.ms_to(e) for s, e in clocks), "wall_us": 1e6 * wall}
    if drafter._call is not None:  # the graph's replays alone
        start, end = _Clock(), _Clock()
        start.record()
        for _ in range(CALLS):
            drafter._call.replay()
        end.record()
        _sync()
        row["replay_us"] = 1e3 * start.ms_to(end) / CALLS
    row["aten_ops"] = count_ops(drafter._step)
    return row


def timings(checked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    shapes = {"tiny": tiny} if DRY else {"tiny": tiny, "gdn-1.3b": gdn13b}
    for shape, build in shapes.items():
        target, model = build(TIME_DTYPE)
        ctxs = contexts(target.config.vocab_size, CONTEXT[shape], CALLS)
        ds = {p: static(model, target, p) for p in PATHS}
        prefilled(target, ctxs[0].prompt_ids, list(ds.values()))
        checked.append({"dtype": str(TIME_DTYPE)[6:], "shape": shape, **compare(ds, ctxs[:CHECKS], None)})
        print(json.dumps(checked[-1]), flush=True)
        for path, d in ds.items():
            rows.append({"shape": shape, "path": path, **time_drafter(d, ctxs)})
            print(json.dumps(rows[-1]), flush=True)
        del target, model, ds
    return rows


def markdown(result: dict[str, Any]) -> str:
    md = [
        f"# eagle-glue: the static EAGLE drafter's tree glue ({result['dtype']}, CUDA graphs, fast forward)",
        "",
        f"{result['device']}, torch {result['torch']}; SpecLA's tree {SPEC}; {CALLS} proposals a row.",
        "",
        "| shape | glue | propose us (event median) | wall us/call | replay us | aten ops | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = result["timings"]
    key = "replay_us" if all("replay_us" in r for r in rows) else "event_us_median"
    base = {r["shape"]: r[key] for r in rows if r["path"] == "legacy"}
    for r in rows:
        replay = f"{r['replay_us']:.1f}" if "replay_us" in r else "-"
        md.append(
            f"| {r['shape']} | {r['path']} | {r['event_us_median']:.1f} | {r['wall_us']:.1f} | {replay} | "
            f"{r['aten_ops']} | {base[r['shape']] / r[key]:.2f}x |"
        )
    md += [
        "",
        "| dtype | shape | new == legacy (tokens, parents, scores) | new == eager tree |",
        "|---|---|---|---|",
    ]
    for c in result["checks"]:
        eager = c.get("same_as_eager", "-")
        md.append(f"| {c['dtype']} | {c.get('shape', 'tiny')} | {c['same_as_legacy']} | {eager} |")
    return "\n".join(md) + "\n"


def main(out: Path) -> None:
    if not DRY and not torch.cuda.is_available():
        sys.exit("eagle-glue.py needs a CUDA GPU (or --cpu-dry-run)")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    torch.manual_seed(0)
    result: dict[str, Any] = {
        "script": "scripts/gpu/eagle-glue.py",
        "device": "cpu (dry run, Triton interpreter)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(TIME_DTYPE).removeprefix("torch."),
        "calls": CALLS,
        "context": CONTEXT,
        "tree": str(SPEC),
        "checks": checks(),
    }
    result["timings"] = timings(result["checks"])
    result["seconds"] = time.perf_counter() - t_start
    (out / "eagle-glue.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    (out / "eagle-glue.md").write_text(md)
    print(md)
    print(f"done in {result['seconds']:.1f} s -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python scripts/gpu/eagle-glue.py OUT_DIR [--cpu-dry-run]")
    main(Path(sys.argv[1]))
