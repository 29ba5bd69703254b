"""fla_sd (SpecLA's FLA-SD baseline) on the graphed engine vs the project's tree-kernel verify of the same
EAGLE chain, tiny-qwen35 in bf16 on CUDA.

1. Device time per step (CUDA events over graph replays) of verify + commit of one EAGLE chain of k
   drafts (k + 1 nodes, recorded from a real fla_sd decode), on its slot:
   - ``fla_sd``: chain slot, fla's ``chunk_gated_delta_rule`` verify + replay commit through fla's
     ``fused_recurrent_gated_delta_rule`` (masked to the accepted length over the slot's length);
   - ``tree_closed_form`` (the SpecLA table's Chain route) and ``tree_replay``: tree slot, the project's
     fused tree kernel + its closed-form commit / the same masked replay.
   Plus synthetic chains filling slots of 4 and 16 nodes.
2. tokens/s of the fla_sd route (and AR) through the graphed target vs HybridLM (eager) over 2 prompts,
   with MAL and whether the tokens equal AR's (bf16: divergences are recorded, not failed).

    python3 scripts/gpu/dev-flasd.py OUT_DIR      writes OUT_DIR/dev-flasd.json and .md, prints a summary
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from repro.data.suites import format_turn, load_suite
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.gdn.backends import recurrent_function
from repro.models.graphed import GraphedTarget, slot_key, slot_size
from repro.models.graphs import GraphedCall
from repro.models.target import open_target
from repro.reporting.records import compare_to_reference
from repro.tree import Tree

K = 6  # the SpecLA table's chain length (repro/experiments/specla.yaml)
NEW_TOKENS = 64
REPS = 200


def per_call_us(fn, n: int = REPS) -> float:  # noqa: ANN001 - a callable
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def step_times(target: GraphedTarget, chain: Tree, accepted: int) -> dict[str, dict[str, float]]:
    """verify, commit and verify + commit (us per step) of ``chain`` per verifier, state restored."""
    out: dict[str, dict[str, float]] = {}
    size = slot_size(chain.size, target.max_nodes)
    for name, verifier, strategy in (
        ("fla_sd", "chain", "replay"),
        ("tree_closed_form", "tree", "closed_form"),
        ("tree_replay", "tree", "replay"),
    ):
        slot = target._slot(size, False, target.capture, verifier)
        slot.set_tree(chain, pad=True)
        verify = target._verify_call(slot)
        verify()
        slot.set_accepted(list(range(accepted)))
        commit = target._commit_call(slot, strategy)
        with target._preserved():  # commits advance the state: restored after
            out[name] = {
                "verify_us": round(per_call_us(verify), 1),
                "commit_us": round(per_call_us(commit), 1),
                "step_us": round(per_call_us(lambda v=verify, c=commit: (v(), c())), 1),
                "slot": size,
            }
    return out


def replay_kernel_us(model: torch.nn.Module, lengths: tuple[int, ...]) -> dict[int, float]:
    """One GDN layer's replay (fla's fused recurrence, tiny-qwen35's shapes, one graph per length): what
    masking the replay to the slot's length costs over replaying only the accepted tokens."""
    m = next(layer.linear_attn for layer in model.model.layers if layer.layer_type == "linear_attention")
    fn = recurrent_function("triton")
    state = torch.zeros(m.num_v_heads, m.head_v_dim, m.head_k_dim, device="cuda")
    out = {}
    for t in lengths:
        k = torch.nn.functional.normalize(torch.randn(t, m.num_k_heads, m.head_k_dim, device="cuda"), dim=-1)
        k = k.to(torch.bfloat16)
        v = torch.randn(t, m.num_v_heads, m.head_v_dim, device="cuda", dtype=torch.bfloat16)
        g = -torch.rand(t, m.num_v_heads, device="cuda")
        beta = torch.rand(t, m.num_v_heads, device="cuda")
        call = GraphedCall(lambda k=k, v=v, g=g, b=beta: fn(k, k, v, g, b, state, 0.0), torch.device("cuda"))
        out[t] = round(per_call_us(call.replay), 2)
    return out


def decode_row(target, engine: str, name: str, route, prompts, refs, errors) -> dict:  # noqa: ANN001
    """tokens/s, MAL and the verdict against AR of ``route`` over ``prompts`` (after an 8-token warm-up)."""
    tokens = seconds = steps = accepted = 0.0
    same = []
    for p, ref in zip(prompts, refs):
        try:
            generate(target, p, route, 8)  # warm-up (drafter, allocator)
            res = generate(target, p, route, NEW_TOKENS, reference_ids=ref)
        except Exception:  # noqa: BLE001 - recorded, the other rows still run
            errors.append(f"{engine} {name}: {traceback.format_exc(limit=3)}")
            continue
        tokens += len(res.output_ids)
        seconds += res.decode_s
        steps += res.steps
        accepted += sum(res.accepted_lengths)
        same.append(compare_to_reference(res.output_ids, ref))
    return {
        "engine": engine, "route": name, "tokens": int(tokens),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "mal": round(accepted / steps, 2) if steps else None, "vs_ar": same,
    }  # fmt: skip


def report(result: dict, out_dir: Path) -> str:
    """The JSON and the markdown of what was measured so far (written after every section)."""
    result["wall_s"] = round(time.perf_counter() - result["_t0"], 1)
    (out_dir / "dev-flasd.json").write_text(
        json.dumps({k: v for k, v in result.items() if k != "_t0"}, indent=1)
    )
    lines = [
        f"# fla_sd on the graphed engine ({result['device']}, tiny-qwen35, bf16, k = {K})",
        "",
        f"chain evaluator: `{result.get('chain_evaluator')}`; graphs captured: {result.get('captures')} "
        f"(prepare {result.get('prepare_s')} s); wall {result['wall_s']} s",
        "",
        "## verify + commit device time per step (us, CUDA events over graph replays)",
        "",
        "| chain | slot | fla_sd verify | fla_sd commit | fla_sd step | tree+closed_form step "
        "| tree+replay step |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, t in result.get("device_us_per_step", {}).items():
        f, c, r = t["fla_sd"], t["tree_closed_form"], t["tree_replay"]
        lines.append(
            f"| {label} | {f['slot']} | {f['verify_us']} | {f['commit_us']} | {f['step_us']} | "
            f"{c['step_us']} | {r['step_us']} |"
        )
    by_length = result.get("replay_kernel_us_by_length", {})
    lines += ["", "fla's fused recurrence, one GDN layer, per replay length (us, graphed): "]
    lines[-1] += ", ".join(f"T={t}: {us}" for t, us in by_length.items())
    lines += ["", f"## decode over 2 prompts ({NEW_TOKENS} new tokens each)", ""]
    lines += ["| engine | route | tok/s | MAL | vs AR (graphed engine) |", "|---|---|---|---|---|"]
    for row in result.get("decode", []):
        lines.append(
            f"| {row['engine']} | {row['route']} | {row['tokens_per_s']} | {row['mal']} | "
            f"{'; '.join(row['vs_ar']) or '-'} |"
        )
    if result["errors"]:
        lines += ["", "## errors", "", *(f"```\n{e}\n```" for e in result["errors"])]
    text = "\n".join(lines) + "\n"
    (out_dir / "dev-flasd.md").write_text(text)
    return text


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/dev-flasd")
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "k": K, "errors": []}
    result["_t0"] = time.perf_counter()
    errors = result["errors"]
    model, tok = open_target("default", "bfloat16", "cuda")
    model.set_gdn_backend("triton")
    vocab = model.config.vocab_size
    ar = build_route({"name": "ar", "kind": "ar"}, vocab, "greedy", 0.0, 42)
    spec = {"name": "fla_sd", "kind": "fla_sd", "k": K}
    route = build_route(spec, vocab, "greedy", 0.0, 42, target=model, family="tiny-qwen35")
    target = GraphedTarget(model)
    t0 = time.perf_counter()
    target.prepare(("closed_form", "replay"), route.drafter.capture_layers, 16, chain=True)
    result["prepare_s"] = round(time.perf_counter() - t0, 2)
    result["captures"] = target.captures
    chain_slot = target._slots[slot_key(8, False, "chain")]
    result["chain_evaluator"] = f"{chain_slot.evaluate.__module__}.{chain_slot.evaluate.__name__}"
    report(result, out_dir)
    prompts = [
        tok.chat_prompt([{"role": "user", "content": format_turn(suite, p.turns[0])}])
        for suite in ("gsm8k", "mt_bench")
        for p in load_suite(suite, 1, 42)
    ]
    refs = [generate(target, p, ar, NEW_TOKENS).output_ids for p in prompts]  # AR on the graphs

    chains: list[Tree] = []  # the EAGLE chains fla_sd verifies, recorded from the graphed decode
    verify = target.verify

    def recording(state, tree, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if tree.size > 1:
            chains.append(tree)
        return verify(state, tree, *args, **kwargs)

    target.verify = recording  # type: ignore[method-assign]
    result["decode"] = [
        decode_row(target, "graphed", n, r, prompts, refs, errors) for n, r in (("ar", ar), ("fla_sd", route))
    ]
    target.verify = verify  # type: ignore[method-assign]
    report(result, out_dir)

    target.prefill(prompts[0])
    eagle = next((c for c in chains if c.size == K + 1), Tree.chain(list(range(10, 11 + K))))
    timing = result["device_us_per_step"] = {}
    for label, chain, accepted in (
        (f"eagle_chain_{K + 1}", eagle, 3),
        ("chain_4", Tree.chain(list(range(10, 14))), 2),
        ("chain_16", Tree.chain(list(range(10, 26))), 5),
    ):
        try:
            timing[label] = step_times(target, chain, accepted)
        except Exception:  # noqa: BLE001
            errors.append(f"timing {label}: {traceback.format_exc(limit=3)}")
    try:
        result["replay_kernel_us_by_length"] = replay_kernel_us(model, (1, 3, 8, 16))
    except Exception:  # noqa: BLE001
        errors.append(f"replay kernel: {traceback.format_exc(limit=3)}")
    report(result, out_dir)

    for name, r in (("fla_sd", route), ("ar", ar)):  # the eager engine last: the slowest
        result["decode"].append(decode_row(model, "eager", name, r, prompts, refs, errors))
        report(result, out_dir)
    print(report(result, out_dir))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
