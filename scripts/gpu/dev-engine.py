"""The graphed engine's greedy device path on the H200: tokens/s and wall vs device time per step.

    python scripts/gpu/dev-engine.py OUT_DIR          (OUT_DIR cpu: a short CPU dry run)

On the embedded tiny-qwen35 (bf16 and float32, Triton GDN kernels, CUDA graphs) it decodes a few suite
prompts with ar, a chain route (synthetic chain k4 p0.8, and DFlash's chain) and ddtree-b32 through
``repro.decoding.engine.generate`` on a ``GraphedTarget``: once on the device path (device tree, device
acceptance and commit, one read a step, CUDA-event stage times) and once on the host path (the same
target with the host tree upload and acceptance walk: the engine before this change). It checks that
float32 greedy equals AR token for token, counts the device reads per step and times the tree builders
and the tree upload. Writes OUT_DIR/dev-engine.json and OUT_DIR/dev-engine.md; prints the markdown.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

import repro.decoding.engine as engine  # noqa: E402
import repro.models.graphed as graphed  # noqa: E402
from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.routes import build_route  # noqa: E402
from repro.decoding.tree_builders import BestFirst, best_first_device  # noqa: E402
from repro.drafters.base import Proposal  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.reporting.records import STAGES, compare_to_reference  # noqa: E402
from repro.tree import DeviceTree  # noqa: E402

ROUTES = [
    {"name": "ar", "kind": "ar"},
    {"name": "chain-k4-p0.8", "kind": "synthetic_chain", "k": 4, "p": 0.8},
    {"name": "dflash-chain", "kind": "dflash_chain", "drafter": "tiny-qwen35-dflash"},
    {"name": "ddtree-b32", "kind": "ddtree", "drafter": "tiny-qwen35-dflash", "budget": 32},
]
NEW_TOKENS = 128
DEVICE = "cuda"
READS = [0]


def counted_read(device: torch.Tensor, host: torch.Tensor) -> list[int]:
    READS[0] += 1
    return REAL_READ(device, host)


REAL_READ = graphed.read_back
graphed.read_back = counted_read


def prompts(tok) -> list[list[int]]:  # noqa: ANN001 - the family tokenizer
    return [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, 1, 42)
    ]


def run_route(target, route, cases, stops, refs, device_path: bool) -> dict:  # noqa: ANN001
    real = engine.device_greedy
    engine.device_greedy = (lambda m, r: real(m, r)) if device_path else (lambda m, r: False)
    try:
        READS[0] = 0
        results = [engine.generate(target, p, route, NEW_TOKENS, stops, ref) for p, ref in zip(cases, refs)]
    finally:
        engine.device_greedy = real
    steps = sum(r.steps for r in results)
    new = sum(len(r.output_ids) for r in results)
    decode = sum(r.decode_s for r in results)
    wall = {s: 1000 * sum(r.stage_s[s] for r in results) / steps for s in STAGES}
    dev = {s: 1000 * sum((r.device_stage_s or {})[s] for r in results) / steps for s in STAGES}
    return {
        "path": "device" if device_path else "host",
        "tokens_per_s": new / decode,
        "steps": steps,
        "mal": sum(sum(r.accepted_lengths) for r in results) / steps,
        "wall_ms_per_step": 1000 * decode / steps,
        "device_ms_per_step": sum(dev.values()),
        "wall_stage_ms": wall,
        "device_stage_ms": dev,
        "reads_per_step": READS[0] / steps,
        "vs_ar": [
            compare_to_reference(r.output_ids, ref) if ref else "reference" for r, ref in zip(results, refs)
        ],
        "outputs": [r.output_ids for r in results],
    }


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn, n: int = 100) -> float:  # noqa: ANN001
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / n


def builder_timing(target: GraphedTarget) -> dict[str, float]:
    """Host time per call (synchronized) of the tree builders and of a 33-node tree's upload."""
    probs = torch.softmax(torch.randn(15, target.config.vocab_size, device=DEVICE), -1)
    prop = Proposal(probs=probs, top_ids=probs.topk(4, -1).indices)
    out = {
        "best_first_host_b32_us": per_call_us(lambda: BestFirst(32).build(1, prop)),
        "best_first_device_b32_us": per_call_us(lambda: best_first_device(1, probs, 32)),
    }
    tree = BestFirst(32).build(1, prop)
    dtree = DeviceTree(tree.tokens.to(DEVICE), tree.parents.to(DEVICE))
    slot = target._slot(64, False, ())
    out["set_tree_host_33_in_64_us"] = per_call_us(lambda: slot.set_tree(tree, pad=True))
    out["set_device_tree_33_in_64_us"] = per_call_us(lambda: slot.set_device_tree(dtree))
    out["derive_64_us"] = per_call_us(slot.derive)
    dev = best_first_device(1, probs, 32).to_tree()
    same = torch.equal(dev.tokens, tree.tokens) and torch.equal(dev.parents, tree.parents)
    out["tree_equal_host_device"] = float(same)
    return out


def one_dtype(dtype: str) -> dict:
    model, tok = open_target("default", dtype, DEVICE)
    if DEVICE == "cuda":
        model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    stops = tuple(tok.stop_token_ids)
    routes = [build_route(s, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35") for s in ROUTES]
    target = GraphedTarget(model)
    layers = tuple(sorted({i for r in routes if r.drafter for i in r.drafter.capture_layers}))
    t0 = time.perf_counter()
    target.prepare(("closed_form",), layers, 64)
    prepare_s = time.perf_counter() - t0
    cases = prompts(tok)
    for route in routes:  # warm-up: compiles, autotuning, the drafters' first calls
        engine.generate(target, cases[0], route, 16, stops, list(range(16)))
    ar = run_route(target, routes[0], cases, stops, [None] * len(cases), True)
    refs = ar["outputs"]
    out = {"prepare_s": prepare_s, "graphs": target.captures, "routes": {}}
    for route in routes:
        rows = [run_route(target, route, cases, stops, refs, path) for path in (True, False)]
        for row in rows:
            row.pop("outputs")
        out["routes"][route.name] = rows
    out["builders"] = builder_timing(target)
    return out


def markdown(res: dict) -> str:
    lines = ["# dev-engine: the graphed engine's greedy device path (tiny-qwen35, H200)", ""]
    for dtype, r in res["dtypes"].items():
        lines += [f"## {dtype} (graphs: {r['graphs']}, prepare {r['prepare_s']:.1f} s)", ""]
        lines += [
            "| route | path | tok/s | MAL | wall ms/step | device ms/step | wall/device | reads/step | "
            + " | ".join(f"{s} wall/dev ms" for s in STAGES)
            + " | vs AR |",
            "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(STAGES) + "---|",
        ]
        for name, rows in r["routes"].items():
            for row in rows:
                stages = " | ".join(
                    f"{row['wall_stage_ms'][s]:.3f} / {row['device_stage_ms'][s]:.3f}" for s in STAGES
                )
                same = sum(v in ("identical", "reference") for v in row["vs_ar"])
                lines.append(
                    f"| {name} | {row['path']} | {row['tokens_per_s']:.0f} | {row['mal']:.2f} | "
                    f"{row['wall_ms_per_step']:.3f} | {row['device_ms_per_step']:.3f} | "
                    f"{row['wall_ms_per_step'] / max(row['device_ms_per_step'], 1e-9):.2f} | "
                    f"{row['reads_per_step']:.2f} | {stages} | {same}/{len(row['vs_ar'])} identical |"
                )
        lines += [
            "",
            "builders and upload (host us per call, synchronized): "
            + ", ".join(f"{k} {v:.1f}" for k, v in r["builders"].items()),
            "",
        ]
    lines += [f"float32 greedy == AR on every route and path: **{res['float32_lossless']}**", ""]
    return "\n".join(lines)


def main() -> None:
    global DEVICE, NEW_TOKENS
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "dev-engine-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    dtypes = ("float32", "bfloat16")
    if len(sys.argv) > 2 and sys.argv[2] == "cpu":
        DEVICE, NEW_TOKENS, dtypes = "cpu", 12, ("float32",)
    start = time.perf_counter()
    res: dict = {"dtypes": {}}
    for dtype in dtypes:
        res["dtypes"][dtype] = one_dtype(dtype)
    res["float32_lossless"] = all(
        v in ("identical", "reference")
        for rows in res["dtypes"]["float32"]["routes"].values()
        for row in rows
        for v in row["vs_ar"]
    )
    res["seconds"] = time.perf_counter() - start
    (out_dir / "dev-engine.json").write_text(json.dumps(res, indent=1))
    text = markdown(res)
    (out_dir / "dev-engine.md").write_text(text)
    print(text)
    print(f"total {res['seconds']:.1f} s")
    if not res["float32_lossless"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
