"""Which of 2026-12-02's engine changes moved the tiny routes' step time: A/B in one process on the H200.

    python3 scripts/gpu/routes-ab.py OUT_DIR          (one H200: < 100 s)
    python3 scripts/gpu/routes-ab.py OUT_DIR cpu      (a CPU dry run of the plumbing: float32, eager)

results/2026-12-02-h200-pdl-slots saw the speculative routes' device step grow by 0.1-0.2 ms on the tiny
family against the day before, with and without dependent launch, and the stage split move from verify into
commit. This script times the same routes (the embedded tiny-qwen35 in bf16 on the graphed engine, greedy,
PROMPTS suite prompts, NEW_TOKENS new tokens, after one warm-up generation) under each VARIANTS entry, each
on a fresh GraphedTarget so that its graphs are captured under that setting:

- ``default``: the code as it is;
- ``pow2_slots``: slot sizes powers of two only (the day before's: 33-node trees padded to 64 rows);
- ``unsplit_attention``: ``attention_tree`` with one split (no combine launch);
- ``no_pdl``: ``dependent_launch(False)`` around capture and replay;
- ``pdl_start`` / ``pdl_exit`` / ``pdl_gemv``: dependent launch releasing the next launch at each kernel's
  start, at its exit, or at the GEMVs' start and the other kernels' exit (``dependent_launch(trigger=)``;
  the default, "auto", releases at the start but in verification);
- ``torch_bookkeeping``: the slot's derive, greedy accept, path and attention-row commit on torch ops, not
  on :mod:`repro.models.slot_kernels` (``static.FUSE_BOOKKEEPING`` off);
- ``no_clock_events``: the engine's own measurement off: StageClock without CUDA events (wall-clock stages
  only) and no busy recorder around the replays (about 12 event records a speculative step): what the
  harness's instrumentation costs each route's wall time (its device columns then read the wall clock);
- ``scaled_rows``: the verify's normed row-tiled linears on the unfolded weights, x scaled in every K step
  (``static.FOLD_NORMS`` off; the default reads :func:`~repro.gdn.triton_linear.fold_norm`'s weights);
- ``auto_rows``: ``verify_form("auto")``: the GEMV kernel in groups of 4 rows up to ``GEMV_VERIFY_ROWS``
  rows (verifies and the drafters' 16-row forwards), the row-tiled kernel above;
- ``torch_topk``: ``torch.topk`` for every row top-k of the drafters and DDTree's tree stage, not
  :mod:`repro.models.topk_kernels`'s kernels (``topk_kernels.KERNELS`` off);
- ``topk_chunk4096`` / ``topk_chunk512``: those kernels on 4096- / 512-entry chunks (the default 1024: a
  4096 row is four programs, then a merge launch);
- ``topk_pool``: the kernels up to k = 512 (``topk_kernels.MAX_K``), so DFlash-TfM's pool (512 of 4096) too;
- ``fold_drafter`` / ``scaled_drafter``: the DFlash block's normed matrices with the norm scales folded in
  (``dflash_fast.FOLD_NORMS``, the default since callCF), as the target's verify reads them / not;
- ``clock_every4``: StageClock's events on every 4th step only (``engine.EVENT_EVERY``), their sums scaled
  to all steps;
- ``torch_argmax``: the greedy accept's row argmax of the verify logits by ``torch.argmax``, not the top-k
  kernels at k = 1 (``topk_kernels.row_argmax``);
- ``kernel_copies`` = ``kernel_tree_copy`` + ``aliased_roots``: a device tree into its verify slot by one
  kernel, not two stream copies (``static.KERNEL_TREE_COPY``), and the best-first graph reading a pipelined
  step's root where it lies, not a stream copy of it (``tree_builders.ALIASED_ROOTS``);
- ``separate_accept``: each pipelined step's acceptance and commit as a graph of their own after the verify's,
  not one graph with it (``graphed.FUSE_ACCEPT`` off; on, their time falls in the verify stage);
- ``fuse_tree``: a pipelined DDTree / chain DFlash step's tree built inside the DFlash drafter's graph
  (``engine.FUSE_TREE``; its time then falls in the draft stage), not after it;
- ``gc_on``: Python's cyclic garbage collector left running while generations are timed (``engine.PAUSE_GC``
  off; the default pauses it inside ``generate``);
- ``stream_copies``: a step's result copied to pinned host memory on the stream with an event behind it
  (``graphed.HOST_WRITES`` off), not stored there by the last kernel of the step's graph (each element
  tagged from a device counter, the host polling the tags);
- ``gated_out_proj``: a GDN layer's output gated norm inside its out_proj's row-tiled launch
  (``static_layers.GATED_OUT_PROJ``; triton_linear.gated_linear_residual), not a launch of its own;
- ``depth2`` / ``depth3``: the pipelined loop two / three steps ahead of the host's read
  (``engine.PIPELINE_DEPTH``; the default: one), so that the host may fall that far behind before the device
  idles;
- ``fused_tree``: every verify's GDN layers on the one-launch fused tree kernel, not the split form (three
  launches: prologue, keys, values) that ``select_tree_kernel`` picks for few value heads in bf16;
- ``peel_root``: the split form's node 0 solved before its row blocks on the 2^k + 1 slots (the switch);
- ``unaligned_mask``: the GDN tree kernels reading a slot's ancestor mask at its own row stride (n), not the
  slot's copy in rows of a multiple of 16 bytes (``triton_tree.MASK_PAD_ABOVE`` out of reach): only slots
  of more than 65 nodes differ, so run it with ROUTES_AB_TREE_BUDGET=128;
- ``default_again``: the default once more, after the variants before it: how far the same rows move within
  one process (the host side of a step varied 1.10-1.43 in wall / busy between machines of one kind,
  results/2026-12-06-h100-peel-root).

ROUTES_AB_VARIANTS (comma-separated names; default all) picks the variants; "default" always runs first.
ROUTES_AB_TREE_BUDGET (default 32): the node budget of the tree routes (DDTree, SpecLA, DFlash-TfM).
ROUTES_AB_BUDGET_S (default 400): a variant starts only if, taking as long as the one before it, it would end
within this many seconds of the start (the first variant, on a fresh machine, also pays the compiles: ~190 s).

Per variant and route: decode ms per verify step (wall, the engine's clock), device ms per step and per stage
(CUDA events; idle gaps included), MAL, and whether the tokens equal the default variant's. Writes
OUT_DIR/routes-ab.json and OUT_DIR/routes-ab.md; prints the markdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding import engine, switches, tree_builders  # noqa: E402
from repro.decoding.engine import STAGES, generate  # noqa: E402
from repro.decoding.routes import build_route, prepare_graphs  # noqa: E402
from repro.gdn import triton_attention, triton_tree  # noqa: E402
from repro.gdn import triton_linear as tlin  # noqa: E402
from repro.gdn.triton_common import dependent_launch  # noqa: E402
from repro.models import graphed, static, topk_kernels  # noqa: E402
from repro.models.target import open_target  # noqa: E402

CPU = sys.argv[2:3] == ["cpu"]
DEVICE = "cpu" if CPU else "cuda"
FAMILY = "tiny-qwen35"
TREE_BUDGET = int(os.environ.get("ROUTES_AB_TREE_BUDGET", "32"))
ROUTES = [
    {"name": "ar", "kind": "ar"},
    {"name": "dflash-chain", "kind": "dflash_chain"},
    {"name": f"ddtree-b{TREE_BUDGET}", "kind": "ddtree", "budget": TREE_BUDGET},
    {
        "name": f"specla-b{TREE_BUDGET}",
        "kind": "specla",
        "budget": TREE_BUDGET,
        "topk": 4,
        "tau": 0.05,
        "depth": 6,
    },
    {"name": f"dflash-tfm-b{TREE_BUDGET}", "kind": "dflash_tfm", "budget": TREE_BUDGET},
]
PROMPTS = 1 if CPU else 3
NEW_TOKENS = 16 if CPU else 96
BUDGET_S = 1e9 if CPU else float(os.environ.get("ROUTES_AB_BUDGET_S", "400"))
DTYPE = "float32" if CPU else "bfloat16"


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class UnclockedStages(engine.StageClock):
    """StageClock without CUDA events: wall-clock stage times only (``no_clock_events``)."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        super().__init__(device, sync)
        self.events = False


@contextlib.contextmanager
def unclocked() -> Iterator[None]:
    """The engine's generate without its event records: no stage events, no busy recorder."""
    with (
        patched(engine, "StageClock", UnclockedStages),
        patched(engine, "busy_recorder", contextlib.nullcontext),
    ):
        yield


@contextlib.contextmanager
def kernel_copies() -> Iterator[None]:
    """Device trees into their slots by one kernel, and a pipelined step's root read in place by the
    best-first graph (callCK's default; off since)."""
    with patched(static, "KERNEL_TREE_COPY", True), patched(tree_builders, "ALIASED_ROOTS", 4):
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "default": contextlib.nullcontext,
    "pow2_slots": lambda: patched(graphed, "SLOT_SIZES", tuple(2**k for k in range(11))),
    "unsplit_attention": lambda: patched(triton_attention, "tree_splits", lambda *args: 1),
    "no_pdl": lambda: dependent_launch(False),
    "pdl_start": lambda: dependent_launch(trigger="start"),
    "pdl_exit": lambda: dependent_launch(trigger="exit"),
    "pdl_gemv": lambda: dependent_launch(trigger="gemv"),
    "torch_bookkeeping": lambda: switches.applied({"fuse_bookkeeping": False}),
    "no_clock_events": unclocked,
    "scaled_rows": lambda: switches.applied({"fold_norms": False}),
    "auto_rows": lambda: tlin.verify_form("auto"),
    "torch_topk": lambda: switches.applied({"topk_kernels": False}),
    "topk_chunk4096": lambda: patched(topk_kernels, "CHUNK", 4096),
    "topk_chunk512": lambda: patched(topk_kernels, "CHUNK", 512),
    "topk_pool": lambda: patched(topk_kernels, "MAX_K", 512),
    "fold_drafter": lambda: switches.applied({"drafter_fold_norms": True}),
    "scaled_drafter": lambda: switches.applied({"drafter_fold_norms": False}),
    "clock_every4": lambda: switches.applied({"clock_every": 4}),
    "torch_argmax": lambda: patched(topk_kernels, "row_argmax", lambda x: x.argmax(-1)),
    "fused_tree": lambda: patched(static, "select_tree_kernel", lambda *args: "fused"),
    "kernel_copies": kernel_copies,
    "separate_accept": lambda: switches.applied({"fuse_accept": False}),
    "gated_out_proj": lambda: switches.applied({"gated_out_proj": True}),
    "fuse_tree": lambda: switches.applied({"fuse_tree": True}),
    "stream_copies": lambda: switches.applied({"host_writes": False}),
    "gc_on": lambda: switches.applied({"pause_gc": False}),
    "depth2": lambda: switches.applied({"pipeline_depth": 2}),
    "depth3": lambda: switches.applied({"pipeline_depth": 3}),
    "kernel_tree_copy": lambda: patched(static, "KERNEL_TREE_COPY", True),
    "aliased_roots": lambda: patched(tree_builders, "ALIASED_ROOTS", 4),
    "peel_root": lambda: switches.applied({"peel_root": True}),
    "unaligned_mask": lambda: patched(triton_tree, "MASK_PAD_ABOVE", 1 << 30),
    "default_again": contextlib.nullcontext,
}


def open_family() -> tuple[Any, Any]:
    """The embedded family's target and tokenizer: bf16 on the Triton kernels on CUDA, float32 on CPU."""
    model, tok = open_target("default", dtype=DTYPE, device=DEVICE)
    if not CPU:
        model.set_gdn_backend("triton")
    return model, tok


def graphed_routes(model: Any, specs: list[dict]) -> tuple[graphed.GraphedTarget, list[Any]]:  # noqa: ANN401
    """A fresh GraphedTarget of ``model`` (CUDA graphs off on CPU) and the greedy routes of ``specs`` on
    it, their graphs captured ahead."""
    target = graphed.GraphedTarget(model, max_nodes=max(64, TREE_BUDGET + 1), graphs=not CPU)
    vocab = model.config.vocab_size
    routes = [build_route(s, vocab, "greedy", 0.0, 42, target=target, family=FAMILY) for s in specs]
    prepare_graphs(target, routes)
    return target, routes


def family_session(specs: list[dict]) -> tuple[Path, graphed.GraphedTarget, list[Any], list[list[int]]]:
    """A script's start on the family's graphed routes of ``specs``: line-buffered stdout, the output
    folder (argv[1], made), the target and routes (:func:`graphed_routes`) and the prompts."""
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    model, tok = open_family()
    target, routes = graphed_routes(model, specs)
    return out, target, routes, prompts(tok)


def prompts(tok: Any) -> list[list[int]]:  # noqa: ANN401 - the family tokenizer
    out = []
    for suite in ("mt_bench", "gsm8k", "humaneval"):
        for p in load_suite(suite, 1, 42):
            out.append(tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}]))
    return out[:PROMPTS]


def variant_rows(name: str, model: Any, tok: Any, reference: dict[str, list[list[int]]]) -> list[dict]:
    """Every route under one variant: a fresh target, its graphs captured ahead, a warm-up, the timed runs."""
    rows = []
    with VARIANTS[name]():
        target, routes = graphed_routes(model, ROUTES)
        for spec, route in zip(ROUTES, routes):
            ps = prompts(tok)
            generate(target, ps[0], route, NEW_TOKENS)  # warm-up (first-use compiles, the drafter's buffers)
            steps, recorded, decode_s, accepted, busy, captures = 0, 0, 0.0, 0, 0.0, 0
            device = dict.fromkeys(STAGES, 0.0)
            outs = []
            for p in ps:
                r = generate(target, p, route, NEW_TOKENS)
                steps += r.launched_steps or r.steps  # the steps launched past the end: their time is in
                recorded += r.steps  # decode_s, not in the accepted lengths
                decode_s += r.decode_s
                accepted += sum(r.accepted_lengths)
                busy += sum((r.busy_stage_s or {}).values())
                captures += r.graph_captures
                for stage, s in (r.device_stage_s or r.stage_s).items():
                    device[stage] += s
                outs.append(r.output_ids)
            reference.setdefault(spec["name"], outs)
            row = {
                "variant": name, "route": spec["name"], "steps": steps, "mal": accepted / max(recorded, 1),
                "wall_ms_per_step": 1e3 * decode_s / max(steps, 1),
                "device_ms_per_step": 1e3 * sum(device.values()) / max(steps, 1),
                "busy_ms_per_step": 1e3 * busy / max(steps, 1), "graph_captures": captures,
                **{f"{k}_ms": 1e3 * v / max(steps, 1) for k, v in device.items()},
                "tokens_equal_default": outs == reference[spec["name"]],
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    del target, routes
    if not CPU:
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    model, tok = open_family()
    reference: dict[str, list[list[int]]] = {}
    rows: list[dict] = []
    picked = os.environ.get("ROUTES_AB_VARIANTS", ",".join(VARIANTS)).split(",")
    last = 0.0  # the previous variant's seconds: the next one is skipped if it would end past the budget
    for name in ["default"] + [v for v in picked if v != "default"]:
        if time.monotonic() - start + last > BUDGET_S:
            rows.append({"variant": name, "skipped": f"the {BUDGET_S:g} s budget would be spent"})
            continue
        began = time.monotonic()
        try:
            rows += variant_rows(name, model, tok, reference)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
        last = time.monotonic() - began
        write(out, rows, time.monotonic() - start)


def write(out: Path, rows: list[dict], seconds: float) -> None:
    device = "CPU (dry run)" if CPU else torch.cuda.get_device_name()
    result = {"device": device, "seconds": seconds, "rows": rows}
    (out / "routes-ab.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# routes-ab on {device} ({seconds:.0f} s): {FAMILY} {DTYPE}, {PROMPTS} prompts x {NEW_TOKENS} new",
        "",
        "| variant | route | MAL | wall ms/step | device ms/step | busy | wall / busy | draft | tree | "
        "verify | commit | captures | same |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        if "route" not in r:
            lines.append(f"| {r['variant']} | {r.get('error') or r.get('skipped')} |" + " |" * 11)
            continue
        stages = " | ".join(f"{r[f'{s}_ms']:.3f}" for s in STAGES)
        ratio = r["wall_ms_per_step"] / r["busy_ms_per_step"] if r["busy_ms_per_step"] else float("nan")
        lines.append(f"| {r['variant']} | {r['route']} | {r['mal']:.2f} | {r['wall_ms_per_step']:.3f} | "
                     f"{r['device_ms_per_step']:.3f} | {r['busy_ms_per_step']:.3f} | {ratio:.3f} | "
                     f"{stages} | {r['graph_captures']} | {r['tokens_equal_default']} |")  # fmt: skip
    medians = {
        v: statistics.median(r["device_ms_per_step"] for r in rows if r.get("variant") == v and "route" in r)
        for v in VARIANTS
        if any(r.get("variant") == v and "route" in r for r in rows)
    }
    lines += ["", "Median device ms per step over the routes: "
              + ", ".join(f"{v} {m:.3f}" for v, m in medians.items())]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "routes-ab.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
