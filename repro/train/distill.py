"""Self-distillation data shared by the drafter recipes: corpus prompts, the target's own greedy
continuations and its hidden features, all through the target's batched chain path
(``HybridLM.forward_chain``, pinned to verify/commit in tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from repro.engine import generate
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.models.state import ModelState
from repro.routes import build_route
from repro.tokenizer import Tokenizer
from repro.train.target import SEPARATOR, encode_document, special_id


def corpus_prompts(
    tok: Tokenizer, docs: list[str], count: int, length: int, gen: torch.Generator
) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens: windows at seeded random offsets of the documents."""
    sep = special_id(tok, SEPARATOR)
    stream = torch.tensor([t for d in docs for t in encode_document(tok, d) + [sep]], dtype=torch.long)
    if stream.numel() <= length:
        raise ConfigError(f"the corpus holds {stream.numel()} tokens: too few for prompts of {length}")
    starts = torch.randint(0, stream.numel() - length, (count,), generator=gen)
    return [stream[s : s + length].tolist() for s in starts.tolist()]


@torch.no_grad()
def greedy_continuations(
    target: HybridLM, prompts: list[list[int]], new_tokens: int, batch: int = 256
) -> torch.Tensor:
    """Prompt + the target's greedy continuation, [N, prompt_len + new_tokens] (no early stop).

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
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if step + 1 < new_tokens:
                logits, _, layers = target.forward_chain(nxt, state=state)
                state = ModelState(layers, state.position + 1)
        rows.append(ids.cpu())
    return torch.cat(rows)


@torch.no_grad()
def _batched(
    target: HybridLM, seqs: torch.Tensor, layers: list[int], batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch of sequences: teacher-forced logits and concatenated outputs of ``layers``."""
    for start in range(0, seqs.shape[0], batch):
        out, hidden = target.forward_train_hidden(
            seqs[start : start + batch].to(target.device), tuple(layers)
        )
        yield out, torch.cat([hidden[i] for i in layers], dim=-1)


def target_outputs(
    target: HybridLM, seqs: torch.Tensor, layers: list[int], batch: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [N, L, V] and concatenated outputs of ``layers`` [N, L, len(layers) * hidden]."""
    logits, feats = zip(*_batched(target, seqs, layers, batch))
    return torch.cat(logits), torch.cat(feats)


def target_features(target: HybridLM, seqs: torch.Tensor, layers: list[int], batch: int = 16) -> torch.Tensor:
    """Concatenated outputs of ``layers`` for every position, [N, L, len(layers) * hidden]."""
    return torch.cat([feats for _, feats in _batched(target, seqs, layers, batch)])


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
) -> dict[str, dict[str, Any]]:
    """Per named route spec: MAL (bonus included), steps, per-depth acceptance and whether every
    greedy output equals AR's."""
    vocab = target.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, seed)
    refs = [generate(target, p, ar, new_tokens).output_ids for p in prompts]
    out: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        route = build_route({"name": name, **spec}, vocab, "greedy", 0.0, seed, target=target)
        lengths: list[int] = []
        paths: list[list[int]] = []
        identical = True
        for p, ref in zip(prompts, refs):
            res = generate(target, p, route, new_tokens)
            lengths += res.accepted_lengths
            paths += res.accepted_paths
            identical &= res.output_ids == ref
        out[name] = {
            "mal": sum(lengths) / max(1, len(lengths)),
            "steps": len(lengths),
            "depth_acceptance": depth_acceptance(paths, max_depth),
            "lossless": identical,
        }
    return out
