"""Weaver's fused device growth (one Triton kernel per node) on the H200: tree check, growth timing and
the dflash_tfm route beside AR.

    python scripts/gpu/dev-growth.py OUT_DIR      writes OUT_DIR/dev-growth.json and .md, prints the markdown

1. check: on the embedded tiny-qwen35 with its trained DFlash (block 16) and Weaver (pool 512), DFlash
   rows of one real prompt, budget 32: the fused growth step (``GrowthStep(fused=True)``, one CUDA graph)
   vs the torch device growth (``fused=False``, one CUDA graph) vs the host reference ``grow``; float32
   (identical trees expected, up to float32 near ties) and bf16 (up to exact bf16 ties).
2. route: the tiny-qwen35 family in bf16 on a GraphedTarget (Triton GDN kernels, CUDA graphs,
   ``prepare_graphs``): ar, dflash_tfm budget 32 with the fused growth and with the torch growth, 8
   suite prompts x 64 new tokens: tokens/s, MAL, speedup over AR, device ms per step by stage
   (``device_stage_s``; draft = DFlash block + growth), outputs vs AR.
3. timing: one growth step (pool top-K, marginals, growth) per graph replay, CUDA events, bf16, budgets
   16 / 32 / 64, torch vs fused; aten ops and kernel launches per node (dispatch-mode count).
4. configs: the fused growth alone at budget 32 per launch option (tile, num_warps, unroll).

The JSON and markdown are rewritten after each section, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.engine import generate  # noqa: E402
from repro.decoding.routes import build_route, prepare_graphs  # noqa: E402
from repro.drafters import growth_kernels  # noqa: E402
from repro.drafters.base import DraftContext  # noqa: E402
from repro.drafters.dflash import DFlashDrafter, load_dflash  # noqa: E402
from repro.drafters.pool import top_k_pool  # noqa: E402
from repro.drafters.weaver import GrowthStep, load_weaver  # noqa: E402
from repro.drafters.weaver_growth import grow, grow_on_device  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.graphs import count_ops  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.reporting.records import STAGES, compare_to_reference  # noqa: E402

DEV = torch.device("cuda")
BUDGETS = (16, 32, 64)
CONFIGS = ((8192, 8, 1), (16384, 8, 1), (8192, 8, 2))  # (tile, num_warps, unroll), budget 32
NEW_TOKENS, PROMPTS = 64, 8


def timed_ms(fn, reps: int) -> float:  # noqa: ANN001
    """Device ms per call by CUDA events, after one warm call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def block(dtype: str):  # noqa: ANN201
    """The trained tiny-qwen35 pair in ``dtype`` and one real DFlash block: (weaver, emb, root, rows,
    logits, feature)."""
    model, tok = open_target("default", dtype, DEV.type)
    dt = model.dtype
    dflash = DFlashDrafter(load_dflash("tiny-qwen35-dflash", dt, DEV), model)
    weaver = load_weaver("tiny-qwen35-weaver", dflash.model, model).to(DEV, dt)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a short poem about the sea and a boat."}])
    dflash.begin(prompt, None)
    _, ver = model.prefill(prompt, capture=dflash.capture_layers)
    dflash.observe_prefill(ver)
    first = int(ver.logits[-1].argmax())
    rows, logits = dflash.block_rows(DraftContext(prompt, [first], ver, list(range(ver.tree.size))))
    return weaver, model.model.embed_tokens.weight, first, rows, logits, dflash.features[-1]


def nodes(growth, n: int) -> list[tuple[int, int]]:  # noqa: ANN001
    return list(zip(growth.tokens[:n].tolist(), growth.parents[:n].tolist()))


def check(dtype: str, budget: int = 32) -> dict:
    weaver, emb, root, rows, logits, feature = block(dtype)
    pool = weaver.config.pool_size
    host = grow(weaver, emb, budget, 4, root, rows, *top_k_pool(logits, pool), feature)
    n = host.tree.size
    want = list(zip(host.tree.tokens.tolist(), host.tree.parents.tolist()))
    out: dict = {"dtype": dtype, "budget": budget, "host_nodes": n}
    grown = {}
    for fused in (False, True):
        step = GrowthStep(weaver, emb, budget, pool, graphs=True, fused=fused)
        growth, _ = step(root, rows, logits, feature)
        grown[fused] = (nodes(growth, n), growth.scores[:n].double().cpu())
    for name, (got, _) in (("torch", grown[False]), ("fused", grown[True])):
        out[f"{name}_equals_host"] = got == want
        out[f"{name}_first_difference_vs_host"] = next(
            (i for i, (a, b) in enumerate(zip(got, want)) if a != b), None
        )
    out["fused_equals_torch"] = grown[True][0] == grown[False][0]
    first = next((i for i, (a, b) in enumerate(zip(grown[True][0], grown[False][0])) if a != b), None)
    out["fused_first_difference_vs_torch"] = first
    if first is not None:  # a tie: the scores at the first difference agree
        out["score_gap_at_first_difference"] = float((grown[True][1][first] - grown[False][1][first]).abs())
    real = ~grown[False][1].isinf()
    out["max_score_error_fused_vs_torch"] = float((grown[True][1][real] - grown[False][1][real]).abs().max())
    return out


def ops_per_node(weaver, emb, root, rows, logits, feature) -> dict:  # noqa: ANN001
    """Aten ops per grown node (torch growth) and the fused growth's aten ops and kernel launches."""
    pool_logits, pool_ids = top_k_pool(logits, weaver.config.pool_size)
    at = torch.tensor([root], device=DEV)
    args = (at, rows, pool_logits, pool_ids, feature)
    torch_ops = [count_ops(functools.partial(grow_on_device, weaver, emb, b, *args)) for b in (16, 32)]
    fused_ops = [
        count_ops(functools.partial(growth_kernels.grow_fused, weaver, emb, b, *args)) for b in (16, 32)
    ]
    return {
        "torch_aten_ops_per_node": (torch_ops[1] - torch_ops[0]) / 16,
        "torch_aten_ops_b32": torch_ops[1],
        "fused_aten_ops_per_node": (fused_ops[1] - fused_ops[0]) / 16,
        "fused_aten_ops_b32": fused_ops[1],
        "fused_kernel_launches_per_node": 1,
        "fused_kernel_launches_b32": 33,
    }


def timing() -> dict:
    weaver, emb, root, rows, logits, feature = block("bfloat16")
    pool = weaver.config.pool_size
    out: dict = {"ops": ops_per_node(weaver, emb, root, rows, logits, feature), "budgets": {}}
    for budget in BUDGETS:
        row = {}
        for name, fused in (("torch", False), ("fused", True)):
            step = GrowthStep(weaver, emb, budget, pool, graphs=True, fused=fused)
            row[f"{name}_graph_ms"] = timed_ms(lambda step=step: step(root, rows, logits, feature), 50)
        row["speedup"] = row["torch_graph_ms"] / row["fused_graph_ms"]
        out["budgets"][budget] = row
    return out


def configs(weaver, emb, root, rows, logits, feature) -> list[dict]:  # noqa: ANN001
    """The fused growth alone (pools given) in one CUDA graph per (tile, num_warps, unroll), budget 32
    (the first: grow_fused's defaults)."""
    from repro.models.graphs import GraphedCall

    pool_logits, pool_ids = top_k_pool(logits, weaver.config.pool_size)
    at = torch.tensor([root], device=DEV)
    out = []
    for tile, warps, unroll in CONFIGS:
        args = (weaver, emb, 32, at, rows, pool_logits, pool_ids, feature, warps, tile, unroll)
        call = GraphedCall(functools.partial(growth_kernels.grow_fused, *args), DEV)
        out.append({"tile": tile, "num_warps": warps, "unroll": unroll, "growth_ms": timed_ms(call, 50)})
    return out


def prompts(tok) -> list[list[int]]:  # noqa: ANN001
    cases = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, 3, 42)
    ]
    return cases[:PROMPTS]


def routes() -> dict:
    model, tok = open_target("default", "bfloat16", DEV.type)
    model.set_gdn_backend("triton")
    vocab, stops = model.config.vocab_size, tuple(tok.stop_token_ids)
    target = GraphedTarget(model)
    specs = [
        {"name": "ar", "kind": "ar"},
        {"name": "dflash-tfm-b32-fused", "kind": "dflash_tfm", "budget": 32},
        {"name": "dflash-tfm-b32-torch", "kind": "dflash_tfm", "budget": 32},
    ]
    built = [build_route(s, vocab, "greedy", 0.0, 42, target=target, family="tiny-qwen35") for s in specs]
    built[1].drafter.step.fused, built[2].drafter.step.fused = True, False
    prepare_graphs(target, built)
    cases = prompts(tok)
    for route in built:  # warm-up: compiles and captures
        generate(target, cases[0], route, 16, stops, list(range(16)))
    out, refs = {}, [None] * len(cases)
    for route in built:
        results = [generate(target, p, route, NEW_TOKENS, stops, ref) for p, ref in zip(cases, refs)]
        steps = sum(r.steps for r in results)
        new = sum(len(r.output_ids) for r in results)
        dev = {s: 1000 * sum((r.device_stage_s or {}).get(s, 0.0) for r in results) / steps for s in STAGES}
        out[route.name] = {
            "tokens_per_s": new / sum(r.decode_s for r in results),
            "mal": sum(sum(r.accepted_lengths) for r in results) / steps,
            "steps": steps,
            "wall_ms_per_step": 1000 * sum(r.decode_s for r in results) / steps,
            "device_stage_ms": dev,
            "vs_ar": [
                compare_to_reference(r.output_ids, ref) if ref else "reference"
                for r, ref in zip(results, refs)
            ],
        }
        if route.name == "ar":
            refs = [r.output_ids for r in results]
    for row in out.values():
        row["speedup_vs_ar"] = row["tokens_per_s"] / out["ar"]["tokens_per_s"]
    return out


def markdown(res: dict) -> str:
    """The sections measured so far (a run cut short still reports what it finished)."""
    lines = [f"# dev-growth: fused Weaver growth ({res['device']}, {res['seconds']:.0f} s)", ""]
    if "check" in res:
        lines += ["## Check (budget 32)", ""]
        lines += [
            "| dtype | fused = torch | fused = host | torch = host | first diff fused/torch | max score err |"
        ]
        lines += ["|---|---|---|---|---:|---:|"]
        for c in res["check"]:
            lines.append(
                f"| {c['dtype']} | {c['fused_equals_torch']} | {c['fused_equals_host']} | "
                f"{c['torch_equals_host']} | "
                f"{c['fused_first_difference_vs_torch']} | {c['max_score_error_fused_vs_torch']:.2e} |"
            )
    if "routes" in res:
        lines += ["", f"## Routes (bf16, {PROMPTS} prompts x {NEW_TOKENS} tokens, GraphedTarget)", ""]
        lines += [
            "| route | tok/s | x AR | MAL | wall ms/step | draft ms | tree ms | verify ms | commit ms | vs AR |"  # noqa: E501
        ]
        lines += ["|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for name, r in res["routes"].items():
            d = r["device_stage_ms"]
            same = sum(v == "identical" for v in r["vs_ar"])
            lines.append(
                f"| {name} | {r['tokens_per_s']:.0f} | {r['speedup_vs_ar']:.2f} | {r['mal']:.2f} | "
                f"{r['wall_ms_per_step']:.3f} | {d['draft']:.3f} | {d['tree']:.3f} | {d['verify']:.3f} | "
                f"{d['commit']:.3f} | {same}/{len(r['vs_ar'])} identical |"
            )
    if "timing" in res:
        ops = res["timing"]["ops"]
        lines += ["", "## Growth step in one CUDA graph (bf16)", ""]
        per, total = ops["fused_aten_ops_per_node"], ops["fused_aten_ops_b32"]
        lines.append(
            f"aten ops per node: torch {ops['torch_aten_ops_per_node']:.0f}; fused {per:.0f} aten ops + 1 "
            f"Triton kernel (budget 32 in all: {total} aten ops, {ops['fused_kernel_launches_b32']} kernels)"
        )
        lines += ["", "| budget | torch ms | fused ms | speedup |", "|---:|---:|---:|---:|"]
        for b, row in res["timing"]["budgets"].items():
            lines.append(
                f"| {b} | {row['torch_graph_ms']:.3f} | {row['fused_graph_ms']:.3f} | {row['speedup']:.1f}x |"
            )
    if "configs" in res:
        lines += ["", "fused growth alone, budget 32, by (tile, num_warps, unroll):"]
        lines += [
            f"- {c['tile']}, {c['num_warps']}, {c['unroll']}: {c['growth_ms']:.3f} ms" for c in res["configs"]
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def write() -> str:
        res["seconds"] = time.perf_counter() - started
        (out_dir / "dev-growth.json").write_text(json.dumps(res, indent=1))
        md = markdown(res)
        (out_dir / "dev-growth.md").write_text(md)
        return md

    sections = (
        ("check", lambda: [check("float32"), check("bfloat16")]),
        ("routes", routes),
        ("timing", timing),
        ("configs", lambda: configs(*block("bfloat16"))),
    )
    for name, run in sections:  # the results so far are on disk after each section
        res[name] = run()
        write()
        print(f"{name} done at {res['seconds']:.0f} s", flush=True)
    print(write())


if __name__ == "__main__":
    main()
