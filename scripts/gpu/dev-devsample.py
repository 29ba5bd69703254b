"""The sampling rules on the graphed engine's device path vs the host path (tiny-qwen35, H200).

    python scripts/gpu/dev-devsample.py OUT_DIR          (OUT_DIR cpu: a short CPU dry run)

At T=1 with the rules sample_match, spec_sampling and traversal on dflash_chain and ddtree-b32 (the
trained tiny DFlash drafter, draft "top"), bf16, 8 suite prompts x 64 new tokens, through
``repro.decoding.engine.generate`` on one ``GraphedTarget``: once on the device path (device tree,
the rule's device twin + commit in one graph, one read a step) and once on the host path (the same
target, the host walk; ``engine.device_sampling`` patched off). Per route x rule x path: tokens/s,
MAL, and device-to-host syncs per step counted by torch's sync debug mode ("warn", every warning
recorded) over two prompts, minus those of a zero-step generate (prefill, first pick, clocks); the
read_back calls per step beside them. In float32 it checks that sample_match decodes the same tokens
on both paths (and as the graphed AR with the same seed). Writes OUT_DIR/dev-devsample.json and .md.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

import repro.decoding.engine as engine  # noqa: E402
import repro.models.graphed as graphed  # noqa: E402
from repro.data.suites import format_turn, load_suite  # noqa: E402
from repro.decoding.routes import build_route, largest_tree, prepare_graphs  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402
from repro.models.target import open_target  # noqa: E402
from repro.reporting.records import compare_to_reference  # noqa: E402

ROUTES = [
    {"name": "dflash-chain", "kind": "dflash_chain", "drafter": "tiny-qwen35-dflash"},
    {"name": "ddtree-b32", "kind": "ddtree", "drafter": "tiny-qwen35-dflash", "budget": 32},
]
RULES = ("sample_match", "spec_sampling", "traversal")
TEMPERATURE, SEED = 1.0, 42
CFG = {"device": "cuda", "new_tokens": 64, "prompts": 8, "sync_prompts": 2}
READS = [0]
REAL_READ = graphed.read_back
REAL_DEVICE_SAMPLING = engine.device_sampling


def counted_read(device: torch.Tensor, host: torch.Tensor) -> list[int]:
    READS[0] += 1
    return REAL_READ(device, host)


graphed.read_back = counted_read


def prompts(tok) -> list[list[int]]:  # noqa: ANN001 - the family tokenizer
    out = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in load_suite(suite, 3, 42)
    ]
    return out[: CFG["prompts"]]


def set_path(device_path: bool) -> None:
    engine.device_sampling = REAL_DEVICE_SAMPLING if device_path else (lambda m, r: False)


def decode(target, route, cases, stops, device_path: bool) -> list:  # noqa: ANN001
    set_path(device_path)
    try:
        return [engine.generate(target, p, route, CFG["new_tokens"], stops) for p in cases]
    finally:
        set_path(True)


def count_syncs(target, route, cases, stops, device_path: bool) -> tuple[float, float]:  # noqa: ANN001
    """(synchronizing calls per step, read_back calls per step) over ``cases``, the syncs of a
    zero-step generate of each prompt (prefill, first pick, the engine's clocks) taken off."""
    if CFG["device"] != "cuda":
        return float("nan"), float("nan")
    set_path(device_path)
    try:
        total = steps = 0
        READS[0] = 0
        for p in cases:
            for new, sign in ((CFG["new_tokens"], 1), (1, -1)):
                torch.cuda.synchronize()
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        got = engine.generate(target, p, route, new, stops)
                    finally:
                        torch.cuda.set_sync_debug_mode(0)
                total += sign * sum("synchroniz" in str(w.message) for w in seen)
                steps += got.steps
        return total / max(steps, 1), READS[0] / max(steps, 1)
    finally:
        set_path(True)


def summary(results: list) -> dict:
    steps = sum(r.steps for r in results)
    new = sum(len(r.output_ids) for r in results)
    decode_s = sum(r.decode_s for r in results)
    return {
        "tokens_per_s": new / decode_s,
        "mal": sum(sum(r.accepted_lengths) for r in results) / max(steps, 1),
        "steps": steps,
        "ms_per_step": 1000 * decode_s / max(steps, 1),
    }


def load(dtype: str):  # noqa: ANN201
    model, tok = open_target("default", dtype, CFG["device"])
    if CFG["device"] == "cuda":
        model.set_gdn_backend("triton")
    return model, tok, GraphedTarget(model)


def routes_for(model, rule: str) -> list:  # noqa: ANN001
    vocab = model.config.vocab_size
    family = "tiny-qwen35"
    return [build_route(s, vocab, rule, TEMPERATURE, SEED, target=model, family=family) for s in ROUTES]


def prepare(target: GraphedTarget, routes: list) -> None:
    """The routes' graphs, the sampling device path's included, captured before any timed decode."""
    prepare_graphs(target, routes)
    engine.prepare_sampling(target, routes, max(largest_tree(r) for r in routes))


def timing(dtype: str) -> dict:
    model, tok, target = load(dtype)
    stops = tuple(tok.stop_token_ids)
    cases = prompts(tok)
    out: dict = {}
    for rule in RULES:
        routes = routes_for(model, rule)
        prepare(target, routes)
        for route in routes:
            for device_path in (True, False):  # warm-up: compiles, the drafter
                decode(target, route, cases[:1], stops, device_path)
            for device_path in (True, False):
                row = summary(decode(target, route, cases, stops, device_path))
                syncs, reads = count_syncs(target, route, cases[: CFG["sync_prompts"]], stops, device_path)
                row |= {"syncs_per_step": syncs, "read_back_per_step": reads}
                out[f"{route.name} | {rule} | {'device' if device_path else 'host'}"] = row
    return out


def sample_match_equal() -> dict:
    """float32 sample_match: device path tokens == host path tokens == graphed AR's sampled tokens."""
    model, tok, target = load("float32")
    stops = tuple(tok.stop_token_ids)
    cases = prompts(tok)
    vocab = model.config.vocab_size
    ar = build_route({"name": "ar", "kind": "ar"}, vocab, "sample_match", TEMPERATURE, SEED)
    ar_out = [engine.generate(target, p, ar, CFG["new_tokens"], stops).output_ids for p in cases]
    routes = routes_for(model, "sample_match")
    prepare(target, routes)
    out = {}
    for route in routes:
        dev = [r.output_ids for r in decode(target, route, cases, stops, True)]
        host = [r.output_ids for r in decode(target, route, cases, stops, False)]
        out[route.name] = {
            "device_vs_host": [compare_to_reference(d, h) for d, h in zip(dev, host)],
            "device_vs_ar": [compare_to_reference(d, a) for d, a in zip(dev, ar_out)],
        }
    return out


def markdown(res: dict) -> str:
    lines = [
        "# dev-devsample: sampling rules on the device path vs the host path (tiny-qwen35, T=1)",
        "",
        f"bf16, {CFG['prompts']} prompts x {CFG['new_tokens']} new tokens; syncs counted by torch's sync "
        "debug mode over the steps of 2 prompts (prefill and clocks taken off)",
        "",
        "| route | rule | path | tok/s | MAL | ms/step | syncs/step | read_back/step |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, row in res["bf16"].items():
        name, rule, path = key.split(" | ")
        lines.append(
            f"| {name} | {rule} | {path} | {row['tokens_per_s']:.0f} | {row['mal']:.2f} | "
            f"{row['ms_per_step']:.3f} | {row['syncs_per_step']:.2f} | {row['read_back_per_step']:.2f} |"
        )
    lines += ["", "float32 sample_match, identical prompts of " + str(CFG["prompts"]) + ":", ""]
    for name, r in res["float32_sample_match"].items():
        dh = sum(v == "identical" for v in r["device_vs_host"])
        da = sum(v == "identical" for v in r["device_vs_ar"])
        lines.append(f"- {name}: device == host {dh}/{len(r['device_vs_host'])}, device == AR {da}")
    lines += ["", f"all equal: **{res['sample_match_equal']}**", ""]
    return "\n".join(lines)


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "dev-devsample-out")
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2 and sys.argv[2] == "cpu":
        CFG.update(device="cpu", new_tokens=12, prompts=2)
    start = time.perf_counter()
    res: dict = {"config": dict(CFG), "bf16": timing("bfloat16" if CFG["device"] == "cuda" else "float32")}
    res["float32_sample_match"] = sample_match_equal()
    res["sample_match_equal"] = all(
        v == "identical" for r in res["float32_sample_match"].values() for v in r["device_vs_host"]
    )
    res["seconds"] = time.perf_counter() - start
    (out_dir / "dev-devsample.json").write_text(json.dumps(res, indent=1))
    text = markdown(res)
    (out_dir / "dev-devsample.md").write_text(text)
    print(text)
    print(f"total {res['seconds']:.1f} s")
    if not res["sample_match_equal"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
