"""`repro train dflash`: a DFlash block drafter trained by self-distillation from a target.

Data (``repro.train.distill.Distillation``): corpus prefixes of ``prompt_len`` tokens, continued
greedily by the target for ``gen_len`` tokens in one batched pass per token through
``HybridLM.forward_chain`` (in float64 these are AR's tokens exactly; tested). The target's
features (outputs of the drafter's ``target_layer_ids`` layers) come from the same chain path over
prompt + continuation, once, with gradients off.

Training (as the DFlash paper describes): per sequence, ``anchors`` random anchor positions a in
the continuation; the block ``[token a, MASK x (block_size - 1)]`` at positions a..a+bs-1 sees the
target features of positions < a and the whole block; rows 1..bs-1 are scored by cross-entropy
against the target's tokens a+1..a+bs-1 through the target's frozen embedding and LM head, row k
weighted by exp(-(k - 1) / gamma). Only the drafter's own weights train.

Report: chain acceptance (mean accepted length per verify step, bonus token included) of a
``dflash_chain`` route on held-out prompts, next to the untrained drafter's, and whether every
output equals AR's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from repro.data.corpus_tokens import special_id
from repro.drafters.dflash import random_dflash_for, save_dflash
from repro.drafters.dflash_model import DFlashDraftModel
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.train.common import at_least
from repro.train.distill import Distillation, DistillRecipe, target_features


@dataclass(kw_only=True)
class DFlashRecipe(DistillRecipe):
    """Everything that decides a DFlash training run (recorded whole in manifest.json)."""

    block_size: int = 8
    draft_layers: int = 1
    target_layer_ids: list[int] | None = None  # None: spread_target_layers(num_features)
    num_features: int = 2
    anchors: int = 8  # blocks per sequence per step
    loss_gamma: float = 4.0  # position weights exp(-(k-1)/gamma); <= 0: uniform

    def __post_init__(self) -> None:
        at_least(self, 1, "draft_layers", "anchors", "num_features")
        if math.isnan(self.loss_gamma):
            raise ConfigError("loss_gamma must be a number (<= 0: uniform weights), got nan")
        super().__post_init__()


def block_loss(
    drafter: DFlashDraftModel,
    target: HybridLM,
    seqs: torch.Tensor,
    features: torch.Tensor,
    anchors: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Weighted cross-entropy of the blocks anchored at ``anchors`` [B, K] of ``seqs`` [B, L].

    Each block's rows see the context features of positions < anchor and the whole block; labels
    past the end of a sequence are ignored.
    """
    length = seqs.shape[1]
    device = seqs.device
    hidden, positions = drafter.anchored_blocks(seqs, features, anchors, target.model.embed_tokens.weight)
    label_pos = positions[:, 1:]
    labels = seqs.repeat_interleave(anchors.shape[1], 0).gather(1, label_pos.clamp(max=length - 1))
    labels = labels.masked_fill(label_pos >= length, -100)
    logits = drafter.compute_logits(hidden[:, 1:], target.lm_head)  # [BK, bs-1, V]
    nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    rows = labels.shape[1]
    weights = torch.ones(rows, device=device)
    if gamma > 0:
        weights = torch.exp(-torch.arange(rows, device=device, dtype=torch.float32) / gamma)
    weights = weights[None] * (labels != -100)
    return (nll * weights).sum() / weights.sum()


def train_dflash(recipe: DFlashRecipe) -> dict[str, Any]:
    """Generate the distillation data, train, write the checkpoint and report acceptance."""
    started = time.perf_counter()
    with Distillation.start(recipe) as run:
        target, device = run.target, run.device
        drafter = random_dflash_for(
            target, seed=recipe.seed, num_layers=recipe.draft_layers, block_size=recipe.block_size,
            target_layer_ids=recipe.target_layer_ids, mask_token_id=special_id(run.tokenizer, "<|mask|>"),
            num_features=recipe.num_features,
        ).train()  # fmt: skip
        layers = list(drafter.config.target_layer_ids)
        features = target_features(target, run.seqs, layers)
        seqs = run.seqs.to(device)

        def step_fn(step: int) -> tuple[torch.Tensor, int]:
            idx, anchors = run.anchored_batch(recipe.anchors)
            loss = block_loss(drafter, target, seqs[idx], features[idx], anchors, recipe.loss_gamma)
            return loss, recipe.batch_size * recipe.anchors * (recipe.block_size - 1)

        title = f"DFlash drafter (block {recipe.block_size}, {recipe.draft_layers} layer)"
        log = run.train_and_save(drafter, step_fn, save_dflash, title)
        chain = {"kind": "dflash_chain", "block_size": recipe.block_size}
        metrics = {
            **run.chain_metrics(chain, recipe.block_size - 1),
            "final_loss_ppl": math.exp(log[-1]["loss"]),
            "target_layer_ids": layers,
        }
        return run.finish("dflash", drafter, log, metrics, started)
