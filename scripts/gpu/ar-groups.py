"""Greedy AR's steps per graph on the graphed engine (``graphed.AR_GROUP``): host pacing against the steps
a stop token wastes, measured on the H200 at the tiny width.

    python3 scripts/gpu/ar-groups.py OUT_DIR          (one H200: < 120 s)
    python3 scripts/gpu/ar-groups.py OUT_DIR cpu      (a CPU dry run of the plumbing: float32, eager)

At widths up to ``graphed.SMALL_WIDTH`` greedy AR runs ``AR_GROUP`` decode steps a graph, one group ahead of
the host (:meth:`GraphedTarget.greedy_decode`), so that the host's Python loop does not pace a step. A turn
that ends at a stop token has then run (and timed) the rest of its group and the whole group launched past
it: up to 2 AR_GROUP - 1 steps, that the speculative routes (one step launched past the end) do not pay in
the same measure. For AR_GROUP in GROUPS (each on a fresh GraphedTarget of the embedded tiny-qwen35, bf16,
Triton kernels, CUDA graphs), after a warm-up generation, this script decodes PROMPTS prompts twice:

- ``length``: NEW_TOKENS new tokens, no stop token: wall ms per step (the engine's clock), the graphs' busy
  ms per step (their own time, host gaps excluded), wall / busy (1: the host keeps up);
- ``stop``: the same prompts with the family's stop tokens: new tokens, steps run past the stop
  (``launched_steps - steps``), wall tokens/s.

It also decodes the same stop-terminated prompts with DDTree (budget 32, pipelined: one step launched past the
end) and prints its speedup over each AR_GROUP's AR, so that the bias the groups put into a speedup is read
off one run. Writes OUT_DIR/ar-groups.json and OUT_DIR/ar-groups.md; prints the markdown.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's repro, not an installed one

from _routes_ab import ab  # noqa: E402 - routes-ab's family, prompts, device and dtype

from repro.decoding.engine import generate  # noqa: E402
from repro.models import graphed  # noqa: E402

GROUPS = (1, 2, 4, 8) if not ab.CPU else (1, 8)
NEW_TOKENS = 16 if ab.CPU else 256
PROMPTS = 1 if ab.CPU else 3


def decode_all(
    target: graphed.GraphedTarget, route: Any, ps: list[list[int]], stops: tuple[int, ...]
) -> dict:
    """Sums over the prompts of one route's generations (after a warm-up generation)."""
    generate(target, ps[0], route, NEW_TOKENS, stops)
    sums = dict(new=0, steps=0, launched=0, decode_s=0.0, busy_s=0.0)
    outs = []
    for p in ps:
        r = generate(target, p, route, NEW_TOKENS, stops)
        sums["new"] += len(r.output_ids)
        sums["steps"] += r.steps
        sums["launched"] += r.launched_steps or r.steps
        sums["decode_s"] += r.decode_s
        sums["busy_s"] += sum((r.busy_stage_s or {}).values())
        outs.append(r.output_ids)
    return sums | {"outputs": outs}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    model, tok = ab.open_family()
    stops = tuple(tok.stop_token_ids)
    ps = [
        tok.chat_prompt([{"role": "user", "content": ab.format_turn(suite, p.turns[0])}])
        for suite in ("mt_bench", "gsm8k", "humaneval")
        for p in ab.load_suite(suite, 2, 42)
    ][: 2 * PROMPTS]
    rows: list[dict[str, Any]] = []
    tree: dict | None = None
    reference = None
    for group in GROUPS:
        with ab.patched(graphed, "AR_GROUP", group):
            target, (ar, ddtree) = ab.graphed_routes(model, [{"name": "ar", "kind": "ar"}, *ab.ROUTES[2:3]])
            length = decode_all(target, ar, ps[:PROMPTS], ())
            stop = decode_all(target, ar, ps, stops)
            if tree is None:
                tree = decode_all(target, ddtree, ps, stops)
            reference = reference or stop["outputs"]
            row = {
                "ar_group": group,
                "wall_ms_per_step": 1e3 * length["decode_s"] / length["steps"],
                "busy_ms_per_step": 1e3 * length["busy_s"] / length["steps"] if length["busy_s"] else None,
                "stop_new_tokens": stop["new"],
                "stop_steps_past_end": stop["launched"] - stop["steps"],
                "stop_tokens_per_s": stop["new"] / stop["decode_s"],
                "ddtree_speedup": (tree["new"] / tree["decode_s"]) / (stop["new"] / stop["decode_s"]),
                "tokens_equal_group_1": stop["outputs"] == reference,
            }
            busy = row["busy_ms_per_step"]
            row["wall_over_busy"] = busy and row["wall_ms_per_step"] / busy
            rows.append(row)
            print(json.dumps(row), flush=True)
        del target, ar, ddtree
        if not ab.CPU:
            torch.cuda.empty_cache()
    assert tree is not None
    extra = {
        "ddtree_tokens_per_s": tree["new"] / tree["decode_s"],
        "ddtree_steps_past_end": tree["launched"] - tree["steps"],
        "ddtree_steps": tree["steps"],
        "prompts": len(ps),
        "new_tokens": NEW_TOKENS,
        "seconds": time.monotonic() - start,
    }
    (out / "ar-groups.json").write_text(json.dumps({"rows": rows, **extra}, indent=2) + "\n")
    cols = list(rows[0])
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    text = "\n".join(
        [
            f"# AR steps per graph (tiny-qwen35, {ab.DTYPE}, {len(ps)} prompts decoded with stop tokens, "
            f"{PROMPTS} at {NEW_TOKENS} tokens for the per-step rows)",
            "",
            "| " + " | ".join(cols) + " |",
            "|" + "---|" * len(cols),
            *("| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows),
            "",
            f"DDTree b32 on the stop-terminated prompts: {extra['ddtree_tokens_per_s']:.1f} tokens/s, "
            f"{extra['ddtree_steps_past_end']} steps past the end over {extra['ddtree_steps']} steps.",
            "",
        ]
    )
    (out / "ar-groups.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
