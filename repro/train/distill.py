"""Self-distillation data shared by the drafter recipes: corpus prompts, the target's own greedy
continuations and its hidden features, all through the target's batched chain path
(``HybridLM.forward_chain``, pinned to verify/commit in tests)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repro.engine import STAGES, generate
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.models.state import ModelState
from repro.routes import build_route
from repro.tokenizer import Tokenizer, load_tokenizer
from repro.train.common import (
    LOSS_FIGURE,
    StepFn,
    TrainRecipe,
    fast_gdn_backend,
    plot_loss,
    resolve_train_device,
    round_weights,
    save_dtype,
    seed_everything,
    train_loop,
    write_json,
    write_manifest,
)
from repro.train.target import SEPARATOR, documents, encode_document, special_id


@dataclass(kw_only=True)
class DistillRecipe(TrainRecipe):
    """What every drafter recipe adds: the target, the corpus, the self-distillation data and the
    held-out evaluation."""

    target: str
    corpus: str
    prompts: int = 64  # self-distillation sequences
    prompt_len: int = 32
    gen_len: int = 64
    eval_prompts: int = 4
    eval_new_tokens: int = 64


@dataclass
class Distillation:
    """The frozen target (float32, fast GDN backend on CUDA), its tokenizer, the seeded data
    generator and the target's greedy continuations of training-corpus prompts."""

    recipe: DistillRecipe
    device: torch.device
    gen: torch.Generator
    target: HybridLM
    tokenizer: Tokenizer
    seqs: torch.Tensor  # [N, prompt_len + gen_len] on the CPU
    generation_s: float

    @classmethod
    def start(cls, recipe: DistillRecipe) -> Distillation:
        if recipe.gen_len < 2 or recipe.prompt_len < 1:
            raise ConfigError("prompt_len must be >= 1 and gen_len >= 2 (anchors lie in the continuation)")
        device = resolve_train_device(recipe.device)
        gen = seed_everything(recipe.seed)
        target = load_target(recipe.target, dtype=torch.float32, device=str(device)).requires_grad_(False)
        fast_gdn_backend(target)
        tok = load_tokenizer(recipe.target)
        docs = documents(Path(recipe.corpus) / "train.txt")
        prompts = corpus_prompts(tok, docs, recipe.prompts, recipe.prompt_len, gen)
        t0 = time.perf_counter()
        seqs = greedy_continuations(target, prompts, recipe.gen_len)
        return cls(recipe, device, gen, target, tok, seqs, time.perf_counter() - t0)

    def train_and_save(
        self, model: nn.Module, step_fn: StepFn, save: Callable[..., Path], title: str
    ) -> list[dict[str, Any]]:
        """Train ``model`` on ``step_fn``, round it to the save dtype (so that what is evaluated is what
        the checkpoint holds), write it with ``save(model, out, dtype=...)`` and plot the loss."""
        out = Path(self.recipe.out)
        log = train_loop(model, step_fn, self.recipe.optim(), out, self.device)
        model.eval()
        dtype = save_dtype(self.recipe.save_dtype)
        save(round_weights(model, dtype), out, dtype=dtype)
        plot_loss(log, out / LOSS_FIGURE, title)
        return log

    def finish(
        self, name: str, model: nn.Module, log: list[dict[str, Any]], metrics: dict[str, Any], started: float
    ) -> dict[str, Any]:
        """Add what every run reports to ``metrics``; write metrics.json and manifest.json."""
        out = Path(self.recipe.out)
        metrics = {
            **metrics,
            "eval_prompts": self.recipe.eval_prompts,
            "first_loss": log[0]["loss"],
            "final_loss": log[-1]["loss"],
            "steps_run": log[-1]["step"] + 1,
            "distill_sequences": int(self.seqs.shape[0]),
            "generation_s": self.generation_s,
            "parameters": sum(p.numel() for p in model.parameters()),
            "wall_s": time.perf_counter() - started,
        }
        write_json(out / "metrics.json", metrics)
        write_manifest(out, {"recipe": name, **dataclasses.asdict(self.recipe)}, self.recipe.seed)
        return metrics

    def chain_metrics(self, chain: dict[str, Any], max_depth: int) -> dict[str, Any]:
        """Held-out greedy acceptance of the trained drafter (``recipe.out``) on the chain route spec
        ``chain`` beside an untrained one: MALs, per-depth acceptance, lossless (both vs AR)."""
        r = self.recipe
        specs = {"trained": {**chain, "drafter": r.out}, "untrained": {**chain, "drafter": "random"}}
        prompts = self.heldout_prompts()
        acc = route_acceptance(self.target, specs, prompts, r.eval_new_tokens, r.seed, max_depth)
        trained, untrained = acc["trained"], acc["untrained"]
        return {
            "heldout_chain_mal": trained["mal"],
            "heldout_chain_mal_untrained": untrained["mal"],
            "heldout_depth_acceptance": trained["depth_acceptance"],
            "lossless": trained["lossless"] and untrained["lossless"],
        }

    def heldout_prompts(self) -> list[list[int]]:
        """``eval_prompts`` held-out corpus prompts (seeded independently of training)."""
        r = self.recipe
        docs = documents(Path(r.corpus) / "heldout.txt")
        return corpus_prompts(
            self.tokenizer, docs, r.eval_prompts, r.prompt_len, torch.Generator().manual_seed(r.seed)
        )


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
    """Per named route spec: MAL (bonus included), steps, per-depth acceptance, mean tree size,
    stage times per step (ms; draft, tree, verify, commit) and whether every greedy output equals
    AR's (``diverged``: on how many prompts it does not; generation ignores stop tokens: every
    prompt yields ``new_tokens``)."""
    vocab = target.config.vocab_size
    ar = build_route({"kind": "ar"}, vocab, "greedy", 0.0, seed)
    refs = [generate(target, p, ar, new_tokens).output_ids for p in prompts]
    out: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        route = build_route({"name": name, **spec}, vocab, "greedy", 0.0, seed, target=target)
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
