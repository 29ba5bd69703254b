"""Greedy acceptance of named routes on token prompts against AR: MAL, per-depth acceptance, stage times
and losslessness (the drafter recipes' held-out metrics and ``repro family report``)."""

from __future__ import annotations

from typing import Any

import torch

from repro.decoding.engine import STAGES, generate
from repro.decoding.routes import build_route, prepare_graphs
from repro.errors import ConfigError
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState


def depth_acceptance(paths: list[list[int]], max_depth: int) -> list[float]:
    """Per draft depth d = 1..max_depth: the fraction of steps whose accepted path reaches d."""
    reached = [len(p) - 1 for p in paths]
    return [sum(r >= d for r in reached) / max(1, len(reached)) for d in range(1, max_depth + 1)]


def route_acceptance(
    target: HybridLM | GraphedTarget,
    specs: dict[str, dict],
    prompts: list[list[int]],
    new_tokens: int,
    seed: int,
    max_depth: int,
    commit: str = "closed_form",
    temperature: float = 0.0,
) -> dict[str, dict[str, Any]]:
    """Per named route spec: MAL (bonus included), steps, per-depth acceptance, mean tree size,
    stage times per step (ms; draft, tree, verify, commit) and whether every greedy output equals
    AR's (``diverged``: on how many prompts it does not; generation ignores stop tokens: every
    prompt yields ``new_tokens``), and tokens/s (new tokens / decode seconds). A spec without
    ``commit`` commits with ``commit``. At ``temperature`` > 0 the rule is ``sample_match`` (the
    target's keyed sample, so outputs still equal AR's): acceptance then is that of sampling.
    On a :class:`GraphedTarget` (the GPU engine) every route's graphs are made, and each route decodes
    the first prompt once untimed, before its timed decodes."""
    vocab = target.config.vocab_size
    rule = ("greedy", 0.0) if temperature == 0 else ("sample_match", float(temperature))
    ar = build_route({"kind": "ar"}, vocab, *rule, seed, commit=commit)
    routes = {
        name: build_route({**spec, "name": name}, vocab, *rule, seed, target=target, commit=commit)
        for name, spec in specs.items()
    }
    graphed = isinstance(target, GraphedTarget)
    if graphed:
        prepare_graphs(target, [ar, *routes.values()])
        generate(target, prompts[0], ar, new_tokens)
    refs = [generate(target, p, ar, new_tokens).output_ids for p in prompts]
    out: dict[str, dict[str, Any]] = {}
    for name, route in routes.items():
        if graphed:
            generate(target, prompts[0], route, new_tokens)
        lengths: list[int] = []
        paths: list[list[int]] = []
        sizes: list[int] = []
        stage = dict.fromkeys(STAGES, 0.0)
        diverged, decode_s, new = 0, 0.0, 0
        for p, ref in zip(prompts, refs):
            res = generate(target, p, route, new_tokens)
            lengths += res.accepted_lengths
            paths += res.accepted_paths
            sizes += res.tree_sizes
            for k in STAGES:
                stage[k] += res.stage_s[k]
            diverged += res.output_ids != ref
            decode_s += res.decode_s
            new += len(res.output_ids)
        steps = max(1, len(lengths))
        out[name] = {
            "mal": sum(lengths) / steps,
            "steps": len(lengths),
            "depth_acceptance": depth_acceptance(paths, max_depth),
            "mean_tree_size": sum(sizes) / steps,
            **{f"{k}_ms_per_step": 1e3 * v / steps for k, v in stage.items()},
            "lossless": diverged == 0,
            "diverged": diverged,
            "tokens_per_s": new / decode_s if decode_s > 0 else float("nan"),
        }
    return out


@torch.no_grad()
def greedy_continuations(
    target: HybridLM,
    prompts: list[list[int]],
    new_tokens: int,
    batch: int = 256,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Prompt + the target's greedy continuation, [N, prompt_len + new_tokens] (no early stop);
    with ``temperature`` > 0, continuations sampled at that temperature (``generator`` seeds them).

    Prompts of one length decode together: one batched prefill, then one batched step per token
    carrying the batched state. In float64 this is AR's output token for token (tested); in
    float32/bf16 rare near-ties may break differently from the tree decode path, which does not
    matter for training data.
    """
    if len({len(p) for p in prompts}) > 1:
        raise ConfigError("greedy_continuations needs prompts of one length")
    rows = []
    for start in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[start : start + batch], dtype=torch.long, device=target.device)
        logits, _, layers = target.forward_chain(ids)
        state = ModelState(layers, ids.shape[1])
        for step in range(new_tokens):
            if temperature > 0:
                probs = torch.softmax(logits[:, -1].double() / temperature, dim=-1).cpu()
                nxt = torch.multinomial(probs, 1, generator=generator).to(ids.device)
            else:
                nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if step + 1 < new_tokens:
                logits, _, layers = target.forward_chain(nxt, state=state)
                state = ModelState(layers, state.position + 1)
        rows.append(ids.cpu())
    return torch.cat(rows)
