"""`repro train dflash`: a DFlash block drafter trained by self-distillation from a target.

Data: corpus prefixes of ``prompt_len`` tokens, continued greedily by the target for
``gen_len`` tokens through ``repro.engine.generate`` with the ``ar`` route, i.e. the exact
decode path whose outputs speculation must reproduce (no second greedy implementation to keep
in step; at tiny scale generation is a small share of the run). The target's features (outputs
of the drafter's ``target_layer_ids`` layers) come from ``HybridLM.forward_train_hidden`` over
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

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from repro.drafters.dflash import DFlashDraftModel, random_dflash_for, save_dflash
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.tokenizer import load_tokenizer
from repro.train.common import (
    LOSS_FIGURE,
    RecipeOptim,
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
from repro.train.distill import corpus_prompts, greedy_continuations, route_acceptance, target_features
from repro.train.target import documents, special_id


@dataclass
class DFlashRecipe(RecipeOptim):
    """Everything that decides a DFlash training run (recorded whole in manifest.json)."""

    target: str
    corpus: str
    out: str
    block_size: int = 8
    draft_layers: int = 1
    target_layer_ids: list[int] | None = None  # None: spread_target_layers(num_features)
    num_features: int = 2
    prompts: int = 64  # self-distillation sequences
    prompt_len: int = 32
    gen_len: int = 64
    anchors: int = 8  # blocks per sequence per step
    loss_gamma: float = 4.0  # position weights exp(-(k-1)/gamma); <= 0: uniform
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    eval_prompts: int = 4
    eval_new_tokens: int = 64
    log_every: int = 1
    save_dtype: str = "fp32"  # bf16: weights rounded before the held-out eval and written in bf16
    time_budget_s: float | None = None


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
    t_start = time.perf_counter()
    out = Path(recipe.out)
    device = resolve_train_device(recipe.device)
    gen = seed_everything(recipe.seed)
    target = load_target(recipe.target, dtype=torch.float32, device=str(device)).requires_grad_(False)
    fast_gdn_backend(target)
    tok = load_tokenizer(recipe.target)
    corpus = Path(recipe.corpus)
    if recipe.gen_len < 2:
        raise ConfigError("gen_len must be >= 2 (anchors lie in the generated continuation)")
    prompts = corpus_prompts(tok, documents(corpus / "train.txt"), recipe.prompts, recipe.prompt_len, gen)
    t0 = time.perf_counter()
    seqs = greedy_continuations(target, prompts, recipe.gen_len)
    gen_s = time.perf_counter() - t0
    drafter = random_dflash_for(
        target, seed=recipe.seed, num_layers=recipe.draft_layers, block_size=recipe.block_size,
        target_layer_ids=recipe.target_layer_ids, mask_token_id=special_id(tok, "<|mask|>"),
        num_features=recipe.num_features,
    ).train()  # fmt: skip
    layers = list(drafter.config.target_layer_ids)
    features = target_features(target, seqs, layers)
    seqs = seqs.to(device)
    first, last = recipe.prompt_len - 1, seqs.shape[1] - 2  # anchors: the last prompt token .. L-2

    def step_fn(step: int) -> tuple[torch.Tensor, int]:
        idx = torch.randint(0, seqs.shape[0], (recipe.batch_size,), generator=gen)
        anchors = torch.randint(first, last + 1, (recipe.batch_size, recipe.anchors), generator=gen)
        loss = block_loss(drafter, target, seqs[idx], features[idx], anchors.to(device), recipe.loss_gamma)
        return loss, recipe.batch_size * recipe.anchors * (recipe.block_size - 1)

    log = train_loop(drafter, step_fn, recipe.optim(), out, device)
    drafter.eval()
    dtype = save_dtype(recipe.save_dtype)
    save_dflash(round_weights(drafter, dtype), out, dtype=dtype)
    plot_loss(
        log, out / LOSS_FIGURE, f"DFlash drafter (block {recipe.block_size}, {recipe.draft_layers} layer)"
    )
    heldout = corpus_prompts(
        tok,
        documents(corpus / "heldout.txt"),
        recipe.eval_prompts,
        recipe.prompt_len,
        torch.Generator().manual_seed(recipe.seed),
    )
    chain = {"kind": "dflash_chain", "block_size": recipe.block_size}
    specs = {"trained": {**chain, "drafter": str(out)}, "untrained": {**chain, "drafter": "random"}}
    acc = route_acceptance(target, specs, heldout, recipe.eval_new_tokens, recipe.seed, recipe.block_size - 1)
    trained, untrained = acc["trained"], acc["untrained"]
    metrics = {
        "heldout_chain_mal": trained["mal"],
        "heldout_chain_mal_untrained": untrained["mal"],
        "heldout_depth_acceptance": trained["depth_acceptance"],
        "lossless": trained["lossless"] and untrained["lossless"],
        "eval_prompts": len(heldout),
        "first_loss": log[0]["loss"],
        "final_loss": log[-1]["loss"],
        "final_loss_ppl": math.exp(log[-1]["loss"]),
        "steps_run": log[-1]["step"] + 1,
        "distill_sequences": int(seqs.shape[0]),
        "generation_s": gen_s,
        "target_layer_ids": layers,
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out / "metrics.json", metrics)
    write_manifest(out, {"recipe": "dflash", **dataclasses.asdict(recipe)}, recipe.seed)
    return metrics
