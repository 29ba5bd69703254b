"""DDTree's best-first tree as one Triton program vs the torch device builder, on the H200.

    python scripts/gpu/dev-bestfirst.py OUT_DIR          (OUT_DIR cpu: a short CPU dry run; set
                                                         TRITON_INTERPRET=1 for its equality part)

1. equality: ``best_first_triton`` (both selections: the tuple reduction ``fused`` and the builtin
   reductions ``plain``) vs ``best_first_device`` on random, dyadic (tie-heavy) and hand-made tie
   marginals at DDTree's shapes (15 depths x 4096, float32 and bf16, budgets 16/32/64/128, top-k =
   min(budget, vocab)), eagerly and through ``GraphedBestFirst`` (CUDA graphs, replayed on fresh data);
2. timing: each builder as ``GraphedBestFirst``: the graph replay alone, the call on a static marginals
   buffer (root fill + replay: what the engine's tree stage runs behind the static DFlash drafter) and on
   other buffers (marginals copy + fill + replay), median us per call over trials (CUDA events around
   back-to-back calls; synchronized host wall), beside a graph of the top-k + float64 log alone (the
   torch part every builder shares);
3. the route: tiny-qwen35 bf16 on a ``GraphedTarget`` (Triton GDN kernels, ``prepare_graphs``), 8 suite
   prompts x 64 new tokens: ar, ddtree-b32 with the Triton builder (the CUDA default now) and with the
   torch builder; tokens/s, speedup over AR, MAL, tree stage device ms/step (``device_stage_s``), device
   ms/step, wall ms/step, identical-to-AR count.

Writes OUT_DIR/dev-bestfirst.json and OUT_DIR/dev-bestfirst.md; prints the markdown. Exit 3 when a tree
differs from the reference.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

import repro.decoding.engine as engine  # noqa: E402
from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.routes import build_route, prepare_graphs  # noqa: E402
from repro.decoding.tree_builders import (  # noqa: E402
    GraphedBestFirst,
    best_first_device,
    best_first_triton,
    top_log_probs,
)
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.graphs import GraphedCall  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.reporting.records import STAGES, compare_to_reference  # noqa: E402

DEVICE = "cuda"
DEPTH, VOCAB = 15, 4096  # DFlash block 16 on tiny-qwen35
BUDGETS = (16, 32, 64, 128)
RANDOM_PER_BUDGET = 16
PROMPTS, NEW_TOKENS = 8, 64
ROUTE_BUDGET = 32  # the routes experiment's ddtree-b32
BUILDERS = {
    "torch": best_first_device,
    "triton-fused": partial(best_first_triton, fused=True),
    "triton-plain": partial(best_first_triton, fused=False),
}


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def marginals(budget: int, dtype: torch.dtype, gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """Random softmax rows (three temperatures), dyadic rows (powers of two and zeros: float64 log sums
    tie across depths and parents) and all-equal rows, [DEPTH, VOCAB] in ``dtype`` on the device."""
    out = []
    for i in range(RANDOM_PER_BUDGET):
        temp = (0.5, 2.0, 6.0)[i % 3]
        out.append((f"random{i}", torch.softmax(temp * torch.randn(DEPTH, VOCAB, generator=gen), -1)))
    for i in range(2):
        dy = 0.5 ** torch.randint(1, 6, (DEPTH, VOCAB), generator=gen).float()
        out.append((f"dyadic{i}", torch.where(torch.rand(DEPTH, VOCAB, generator=gen) < 0.2, 0.0, dy)))
    out.append(("equal", torch.full((DEPTH, VOCAB), 1 / VOCAB)))
    return [(name, p.to(device=DEVICE, dtype=dtype)) for name, p in out]


def same(a, b) -> bool:  # noqa: ANN001 - DeviceTree or Tree
    return (
        a.size == b.size
        and torch.equal(a.tokens.cpu(), b.tokens.cpu())
        and torch.equal(a.parents.cpu(), b.parents.cpu())
    )


def equality() -> dict:
    """Mismatches of every builder (eager, and graphed on CUDA) against the eager torch reference."""
    res: dict = {"trees": 0, "mismatches": []}
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        for budget in BUDGETS:
            cases = marginals(budget, dtype, gen)
            graphs = {}
            if DEVICE == "cuda":
                graphs = {k: GraphedBestFirst(cases[0][1], budget, f) for k, f in BUILDERS.items()}
            for i, (name, probs) in enumerate(cases):
                root = 1000 + i
                ref = best_first_device(root, probs, budget)
                got = {k: f(root, probs, budget) for k, f in BUILDERS.items() if k != "torch"}
                got.update({f"{k}-graph": g(root, probs) for k, g in graphs.items()})
                res["trees"] += 1
                for key, tree in got.items():
                    if not same(tree, ref):
                        res["mismatches"].append(f"{key} {dtype} b{budget} {name}")
    return res


def median_us(call, trials: int = 25, reps: int = 20) -> dict[str, float]:  # noqa: ANN001
    """Median per call over ``trials``: CUDA events around ``reps`` back-to-back calls, and host wall of
    one synchronized call."""
    for _ in range(3):
        call()
    sync()
    events, walls = [], []
    for _ in range(trials):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                call()
            end.record()
            end.synchronize()
            events.append(1000 * start.elapsed_time(end) / reps)
        t0 = time.perf_counter()
        call()
        sync()
        walls.append(1e6 * (time.perf_counter() - t0))
    return {
        "event_us": statistics.median(events) if events else float("nan"),
        "wall_us": statistics.median(walls),
    }


def timing() -> dict:
    """Per budget: each builder's graph (copy + fill + replay), the top-k + log graph alone, and the fused
    kernel at 4 warps (budget 128)."""
    gen = torch.Generator().manual_seed(1)
    out: dict = {}
    for budget in BUDGETS:
        probs = torch.softmax(2 * torch.randn(DEPTH, VOCAB, generator=gen), -1).to(DEVICE)
        row: dict = {}
        builders = dict(BUILDERS)
        if budget == 128:
            builders["triton-fused-4warps"] = partial(best_first_triton, fused=True, num_warps=4)
        for key, fn in builders.items():
            if DEVICE == "cuda":
                graphed = GraphedBestFirst(probs, budget, fn)
                row[key] = median_us(lambda g=graphed, p=probs: g(7, p))
                row[key]["replay_us"] = median_us(graphed.call.replay)["event_us"]
                aliased = GraphedBestFirst(probs, budget, fn, alias=True)  # reads probs in place: no copy
                row[key]["alias_us"] = median_us(lambda g=aliased, p=probs: g(7, p))["event_us"]
            else:
                row[key] = median_us(lambda f=fn, p=probs, b=budget: f(7, p, b), trials=3, reps=1)
        if DEVICE == "cuda":
            static = probs.clone()
            topk = GraphedCall(lambda s=static, b=budget: top_log_probs(s, b), static.device)
            row["topk+log"] = median_us(topk.replay)
            row["topk+log"]["replay_us"] = row["topk+log"]["event_us"]
        out[str(budget)] = row
    return out


def prompts(tok) -> list[list[int]]:  # noqa: ANN001 - the family tokenizer
    per = {"mt_bench": 3, "gsm8k": 3, "humaneval": 2}
    cases = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite, n in per.items()
        for p in load_suite(suite, n, 42)
    ]
    return cases[:PROMPTS]


def run_route(target, route, cases, stops, refs) -> dict:  # noqa: ANN001
    results = [engine.generate(target, p, route, NEW_TOKENS, stops, ref) for p, ref in zip(cases, refs)]
    steps = sum(r.steps for r in results)
    new = sum(len(r.output_ids) for r in results)
    decode = sum(r.decode_s for r in results)
    dev = {s: 1000 * sum((r.device_stage_s or r.stage_s)[s] for r in results) / steps for s in STAGES}
    return {
        "tokens_per_s": new / decode,
        "new_tokens": new,
        "steps": steps,
        "mal": sum(sum(r.accepted_lengths) for r in results) / steps,
        "wall_ms_per_step": 1000 * decode / steps,
        "device_ms_per_step": sum(dev.values()),
        "device_stage_ms": dev,
        "vs_ar": [
            compare_to_reference(r.output_ids, ref) if ref else "reference" for r, ref in zip(results, refs)
        ],
        "outputs": [r.output_ids for r in results],
    }


def routes(dtype: str) -> dict:
    model, tok = open_target("default", dtype, DEVICE)
    if DEVICE == "cuda":
        model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    stops = tuple(tok.stop_token_ids)
    dd = {"kind": "ddtree", "drafter": "tiny-qwen35-dflash", "budget": ROUTE_BUDGET}
    specs = [
        {"name": "ar", "kind": "ar"},
        {**dd, "name": f"ddtree-b{ROUTE_BUDGET}-triton"},
        {**dd, "name": f"ddtree-b{ROUTE_BUDGET}-torch"},
    ]
    built = [build_route(s, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35") for s in specs]
    built[1].builder.device_build = best_first_triton if DEVICE == "cuda" else None
    built[2].builder.device_build = best_first_device
    target = GraphedTarget(model)
    t0 = time.perf_counter()
    prepare_graphs(target, built)
    prepare_s = time.perf_counter() - t0
    cases = prompts(tok)
    for route in built:  # warm-up: compiles, the drafters' first calls, the best-first graphs
        engine.generate(target, cases[0], route, 16, stops, list(range(16)))
    ar = run_route(target, built[0], cases, stops, [None] * len(cases))
    rows = {"ar": ar}
    for route in built[1:]:
        rows[route.name] = run_route(target, route, cases, stops, ar["outputs"])
    for row in rows.values():
        row.pop("outputs")
        row["speedup_vs_ar"] = row["tokens_per_s"] / ar["tokens_per_s"]
    return {"dtype": dtype, "prepare_s": prepare_s, "routes": rows}


def cell(t: dict[str, float]) -> str:
    values = [t.get("replay_us"), t.get("alias_us"), t["event_us"], t["wall_us"]]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in values)


def markdown(res: dict) -> str:
    eq = res["equality"]
    lines = [
        "# dev-bestfirst: DDTree's best-first tree as one Triton program",
        "",
        f"device: {res['device']}; total {res['seconds']:.1f} s",
        "",
        f"## Equality vs best_first_device: {eq['trees']} marginals x builders (eager + graphed), "
        f"**{len(eq['mismatches'])} mismatches**",
        "",
    ]
    lines += [f"- {m}" for m in eq["mismatches"][:20]]
    lines += [
        "",
        "## Builders as CUDA graphs, median us per call: graph replay alone (events, back to back) / the "
        "engine's call on a static marginals buffer, fill + replay (events) / on other buffers, copy + fill "
        "+ replay (events) / that call's synchronized host wall",
        "",
    ]
    keys = list(dict.fromkeys(k for row in res["timing"].values() for k in row))
    lines += ["| budget | " + " | ".join(keys) + " |", "|---:|" + "---:|" * len(keys)]
    for budget, row in res["timing"].items():
        cells = [cell(row[k]) if k in row else "" for k in keys]
        lines.append(f"| {budget} | " + " | ".join(cells) + " |")
    r = res.get("routes")
    if r:
        lines += [
            "",
            f"## tiny-qwen35 {r['dtype']}, graphed target, {PROMPTS} prompts x {NEW_TOKENS} tokens "
            f"(prepare {r['prepare_s']:.1f} s)",
            "",
            "| route | tok/s | vs AR | MAL | tree ms/step (device) | device ms/step | wall ms/step | "
            + " | ".join(f"{s} ms" for s in STAGES)
            + " | identical to AR |",
            "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(STAGES) + "---|",
        ]
        for name, row in r["routes"].items():
            ident = sum(v in ("identical", "reference") for v in row["vs_ar"])
            stages = " | ".join(f"{row['device_stage_ms'][s]:.3f}" for s in STAGES)
            lines.append(
                f"| {name} | {row['tokens_per_s']:.0f} | {row['speedup_vs_ar']:.2f}x | {row['mal']:.2f} | "
                f"{row['device_stage_ms']['tree']:.3f} | {row['device_ms_per_step']:.3f} | "
                f"{row['wall_ms_per_step']:.3f} | {stages} | {ident}/{len(row['vs_ar'])} |"
            )
    elif "routes_error" in res:
        lines += ["", f"route run failed: {res['routes_error']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    global DEVICE, BUDGETS, RANDOM_PER_BUDGET, PROMPTS, NEW_TOKENS
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "dev-bestfirst-out")
    dtype = "bfloat16"
    if len(sys.argv) > 2 and sys.argv[2] == "cpu":
        DEVICE, BUDGETS, RANDOM_PER_BUDGET, PROMPTS, NEW_TOKENS, dtype = "cpu", (16,), 2, 2, 8, "float32"
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    res: dict = {"device": name, "depth": DEPTH, "vocab": VOCAB, "budgets": list(BUDGETS)}
    res["equality"] = equality()
    print(f"equality: {res['equality']['trees']} marginals, {len(res['equality']['mismatches'])} mismatches")
    res["timing"] = timing()
    print(f"timing done at {time.perf_counter() - start:.1f} s")
    try:
        res["routes"] = routes(dtype)
    except Exception as exc:  # keep the kernel results when the route run breaks
        res["routes_error"] = f"{type(exc).__name__}: {exc}"
    res["seconds"] = time.perf_counter() - start
    (out_dir / "dev-bestfirst.json").write_text(json.dumps(res, indent=1))
    text = markdown(res)
    (out_dir / "dev-bestfirst.md").write_text(text)
    print(text)
    if res["equality"]["mismatches"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
