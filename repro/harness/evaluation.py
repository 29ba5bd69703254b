"""Greedy acceptance of named routes on token prompts against AR: MAL, per-depth acceptance, stage times
and losslessness (the drafter recipes' held-out metrics and ``repro family report``)."""

from __future__ import annotations

from typing import Any

from repro.decoding.engine import STAGES, generate
from repro.decoding.routes import build_route
from repro.models.hybrid import HybridLM


def depth_acceptance(paths: list[list[int]], max_depth: int) -> list[float]:
    """Per draft depth d = 1..max_depth: the fraction of steps whose accepted path reaches d."""
    reached = [len(p) - 1 for p in paths]
    return [sum(r >= d for r in reached) / max(1, len(reached)) for d in range(1, max_depth + 1)]


def route_acceptance(
    target: HybridLM,
    specs: dict[str, dict],
    prompts: list[list[int]],
    new_tokens: int,
    seed: int,
    max_depth: int,
    commit: str = "closed_form",
) -> dict[str, dict[str, Any]]:
    """Per named route spec: MAL (bonus included), steps, per-depth acceptance, mean tree size,
    stage times per step (ms; draft, tree, verify, commit) and whether every greedy output equals
    AR's (``diverged``: on how many prompts it does not; generation ignores stop tokens: every
    prompt yields ``new_tokens``). A spec without ``commit`` commits with ``commit``."""
    vocab = target.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, seed, commit=commit)
    refs = [generate(target, p, ar, new_tokens).output_ids for p in prompts]
    out: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        route = build_route({**spec, "name": name}, vocab, "greedy", 0.0, seed, target=target, commit=commit)
        lengths: list[int] = []
        paths: list[list[int]] = []
        sizes: list[int] = []
        stage = dict.fromkeys(STAGES, 0.0)
        diverged = 0
        for p, ref in zip(prompts, refs):
            res = generate(target, p, route, new_tokens)
            lengths += res.accepted_lengths
            paths += res.accepted_paths
            sizes += res.tree_sizes
            for k in STAGES:
                stage[k] += res.stage_s[k]
            diverged += res.output_ids != ref
        steps = max(1, len(lengths))
        out[name] = {
            "mal": sum(lengths) / steps,
            "steps": len(lengths),
            "depth_acceptance": depth_acceptance(paths, max_depth),
            "mean_tree_size": sum(sizes) / steps,
            **{f"{k}_ms_per_step": 1e3 * v / steps for k, v in stage.items()},
            "lossless": diverged == 0,
            "diverged": diverged,
        }
    return out
