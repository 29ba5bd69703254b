"""Self-distillation data shared by the drafter recipes: corpus prompts, the target's own greedy
continuations and its hidden features, all through the target's batched chain path
(``HybridLM.forward_chain``, pinned to verify/commit in tests)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

from repro.data.corpus_tokens import corpus_prompts, documents
from repro.errors import ConfigError
from repro.harness.evaluation import greedy_continuations, route_acceptance
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.models.tokenizer import Tokenizer, load_tokenizer
from repro.reporting.records import write_json
from repro.train.common import (
    LOSS_FIGURE,
    StepFn,
    TrainRecipe,
    at_least,
    fast_gdn_backend,
    plot_loss,
    resolve_train_device,
    round_weights,
    save_dtype,
    seed_everything,
    train_loop,
    write_manifest,
)


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

    def __post_init__(self) -> None:
        if self.gen_len < 2 or self.prompt_len < 1:
            raise ConfigError("prompt_len must be >= 1 and gen_len >= 2 (anchors lie in the continuation)")
        at_least(self, 1, "prompts", "eval_prompts", "eval_new_tokens")
        super().__post_init__()


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
    lock: IO[str]  # on ``recipe.out`` (:meth:`TrainRecipe.claim_out`), released on leaving the with block

    @classmethod
    def start(cls, recipe: DistillRecipe) -> Distillation:
        """Claim ``recipe.out`` and make the data; use as ``with Distillation.start(recipe) as run:`` (the
        out-folder lock is released when the block ends, a failed training too)."""
        lock = recipe.claim_out()
        try:
            device = resolve_train_device(recipe.device)
            gen = seed_everything(recipe.seed)
            target = load_target(recipe.target, dtype=torch.float32, device=str(device)).requires_grad_(False)
            fast_gdn_backend(target)
            tok = load_tokenizer(recipe.target)
            docs = documents(Path(recipe.corpus) / "train.txt")
            prompts = corpus_prompts(tok, docs, recipe.prompts, recipe.prompt_len, gen)
            t0 = time.perf_counter()
            seqs = greedy_continuations(target, prompts, recipe.gen_len)
        except BaseException:
            lock.close()
            raise
        return cls(recipe, device, gen, target, tok, seqs, time.perf_counter() - t0, lock)

    def __enter__(self) -> Distillation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.close()

    def anchored_batch(self, anchors: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch's draws from the run's generator: ``recipe.batch_size`` random sequence indices
        [B] (CPU) and ``anchors`` random anchor positions each, [B, anchors] on the device, from the last
        prompt token to the sequences' second-last token (a block after each lies in the continuation)."""
        rows = self.recipe.batch_size
        first, last = self.recipe.prompt_len - 1, self.seqs.shape[1] - 2
        idx = torch.randint(0, self.seqs.shape[0], (rows,), generator=self.gen)
        at = torch.randint(first, last + 1, (rows, anchors), generator=self.gen)
        return idx, at.to(self.device)

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
        specs = chain_specs(chain, r.out)
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


def chain_specs(chain: dict[str, Any], drafter: str) -> dict[str, dict[str, Any]]:
    """The held-out chain comparison's route specs: ``chain`` with the trained drafter at ``drafter`` beside
    an untrained (random) one."""
    return {"trained": {**chain, "drafter": drafter}, "untrained": {**chain, "drafter": "random"}}


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
