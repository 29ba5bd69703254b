"""`repro train eagle`: an EAGLE drafter trained by self-distillation on the target's features.

Data (as `repro train dflash`): corpus prefixes of ``prompt_len`` tokens continued greedily by the
target for ``gen_len`` tokens through the ``ar`` route; the target's features (outputs of the
drafter's ``target_layer_ids`` layers, and of the last decoder layer) over prompt + continuation
come from ``HybridLM.forward_train_hidden`` once, with gradients off. The target's next token at
every position is the argmax of its own head on its last-layer feature (on the continuation that
is the sequence's next token; on the prompt, the target's prediction rather than the corpus's).

Training (EAGLE's recipe), teacher-forced on true features: row t reads token t+1 and feature f_t
(plus, optionally, uniform noise of half-width ``feature_noise``, drawn from the seeded
generator) and predicts f_{t+1}; the loss is ``w_reg * smooth_l1(pred_t, f_{t+1}) + w_cls *
cross_entropy(head(norm(pred_t)), target's next token at t+1)`` over every row. Only the
drafter's own weights train; the target's embedding, final norm and head stay frozen.

Report: held-out chain acceptance (MAL per verify step, bonus token included) of an
``eagle_chain`` route with ``k`` drafts, next to the untrained drafter's, and whether every output
equals AR's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from repro.decoding.routes import resolve_spec
from repro.drafters.eagle import EagleDraftModel, random_eagle_for, save_eagle
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.train.distill import Distillation, DistillRecipe, chain_specs, target_features


@dataclass(kw_only=True)
class EagleRecipe(DistillRecipe):
    """Everything that decides an EAGLE training run (recorded whole in manifest.json)."""

    draft_layers: int = 1
    target_layer_ids: list[int] | None = None  # None: the target's last decoder layer
    w_reg: float = 1.0  # smooth-L1 feature regression
    w_cls: float = 0.1  # token cross-entropy
    feature_noise: float = 0.0  # half-width of uniform noise on input features (EAGLE: 0.1)
    k: int = 4  # drafts per step of the held-out eagle_chain evaluation

    def __post_init__(self) -> None:
        for name in ("w_reg", "w_cls", "feature_noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.w_reg == self.w_cls == 0:
            raise ConfigError("w_reg and w_cls are both 0: the loss would train nothing")
        for name, spec in chain_specs(self.heldout_chain(), self.out).items():  # checked before training
            resolve_spec({"name": name, **spec})
        super().__post_init__()

    def heldout_chain(self) -> dict[str, Any]:
        """The held-out evaluation's chain route (its drafter set by :func:`chain_specs`)."""
        return {"kind": "eagle_chain", "k": self.k}


@dataclass
class EagleBatch:
    """Sequences [B, L] with the target's input features [B, L, F], last-layer features [B, L, d]
    and next tokens [B, L] (the target's argmax after each position)."""

    ids: torch.Tensor
    features: torch.Tensor
    last: torch.Tensor
    next_tokens: torch.Tensor

    def __getitem__(self, idx: torch.Tensor) -> EagleBatch:
        return EagleBatch(self.ids[idx], self.features[idx], self.last[idx], self.next_tokens[idx])


def distill_batch(target: HybridLM, seqs: torch.Tensor, layers: list[int]) -> EagleBatch:
    """The target's features of ``seqs`` for drafter input (``layers``) and as regression targets."""
    last = target.config.num_hidden_layers - 1
    feats = target_features(target, seqs, [*layers, last])
    width = len(layers) * target.config.hidden_size
    inputs, last_feats = feats[..., :width], feats[..., width:]
    with torch.no_grad():
        next_tokens = torch.cat(
            [target.lm_head(target.model.norm(chunk)).argmax(-1) for chunk in last_feats.split(16)]
        )
    return EagleBatch(seqs.to(feats.device), inputs, last_feats, next_tokens)


def eagle_losses(
    drafter: EagleDraftModel, target: HybridLM, batch: EagleBatch, noise: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced smooth-L1 feature loss, token cross-entropy and top-1 agreement with the target.

    Row t (t < L - 1) reads token t+1 and feature f_t (+ ``noise`` [B, L-1, F]) at position t.
    """
    b, length = batch.ids.shape
    features = batch.features[:, :-1]
    if noise is not None:
        features = features + noise.to(features)
    positions = torch.arange(length - 1, device=features.device).expand(b, -1)
    pred, _ = drafter(batch.ids[:, 1:], features, positions, target.model.embed_tokens.weight)
    reg = F.smooth_l1_loss(pred.float(), batch.last[:, 1:].float())
    logits = drafter.compute_logits(pred, target).float()
    labels = batch.next_tokens[:, 1:]
    cls = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    agree = (logits.argmax(-1) == labels).float().mean()
    return reg, cls, agree


def train_eagle(recipe: EagleRecipe) -> dict[str, Any]:
    """Generate the distillation data, train, write the checkpoint and report acceptance."""
    started = time.perf_counter()
    with Distillation.start(recipe) as run:
        target, gen, device, seqs = run.target, run.gen, run.device, run.seqs
        drafter = random_eagle_for(
            target, seed=recipe.seed, num_layers=recipe.draft_layers, target_layer_ids=recipe.target_layer_ids
        ).train()
        layers = list(drafter.config.target_layer_ids)
        data = distill_batch(target, seqs, layers)
        noise_shape = (recipe.batch_size, seqs.shape[1] - 1, drafter.config.feature_size)

        def step_fn(step: int) -> tuple[torch.Tensor, int]:
            idx = torch.randint(0, seqs.shape[0], (recipe.batch_size,), generator=gen)
            noise = None
            if recipe.feature_noise > 0:
                noise = (2 * torch.rand(noise_shape, generator=gen) - 1) * recipe.feature_noise
            reg, cls, _ = eagle_losses(drafter, target, data[idx.to(device)], noise)
            return recipe.w_reg * reg + recipe.w_cls * cls, recipe.batch_size * (seqs.shape[1] - 1)

        title = f"EAGLE drafter ({recipe.draft_layers} layer, features {layers})"
        log = run.train_and_save(drafter, step_fn, save_eagle, title)
        with torch.no_grad():
            reg, cls, agree = eagle_losses(drafter, target, data)
        metrics = {
            **run.chain_metrics(recipe.heldout_chain(), recipe.k),
            "chain_k": recipe.k,
            "train_reg_loss": float(reg),
            "train_cls_loss": float(cls),
            "train_top1_agreement": float(agree),
            "target_layer_ids": layers,
        }
        return run.finish("eagle", drafter, log, metrics, started)
