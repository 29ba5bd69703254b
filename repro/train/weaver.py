"""`repro train weaver`: a Weaver adapter trained by self-distillation over a frozen DFlash drafter.

Data: as for DFlash (``repro.train.distill``): corpus prefixes of ``prompt_len`` tokens continued
greedily by the target for ``gen_len`` tokens; the target's logits and features over prompt +
continuation are computed once.

Training (teacher forcing along the target's own greedy tokens): per sequence, ``anchors`` random
anchors a in the continuation. The frozen DFlash drafter runs the block at a (context: target
features of positions < a) and gives rows g_j, logits l_j and pools P_j (top ``pool_size``) for
depths j = 1..T-1. Weaver's path is the true continuation: element j gets g_j, the embedding of
token a + j - 1 (its parent) and the target features of position a - 1, with a causal mask; its
conditional q_j over P_j is scored against p_j, the target's next-token distribution at position
a + j - 1, softmax(logits / ``target_temperature``) (rows past the end of the sequence are
dropped). With m_j = p_j(P_j) the target mass
inside the pool and p~_j = p_j restricted to P_j and renormalised:

    KL_j = KL(p~_j || q_j)       (q_j is 0 outside the pool, so p's outside mass is renormalised away)
    TV_j = (sum_{t in P_j} |p_j(t) - q_j(t)| + (1 - m_j)) / 2     (the exact TV(p_j, q_j): the
           outside mass counts fully, with no gradient; q cannot reach it)
    loss = mean_j [(1 - tv_weight) KL_j + tv_weight TV_j]

Only the adapter trains; it starts with ``out_proj = 0``, i.e. as DFlash's marginals on the pool.
``target_temperature`` 1 distils the target's own distribution (right for sampling at T = 1);
greedy verification accepts only the target's argmax, and a sharper target (e.g. 0.25) teaches
Weaver to rank and to spend the tree budget for that (on the CPU smoke it is what lifts Weaver's
MAL above DDTree's; see README).

Report (metrics.json): on held-out prompts, MAL and per-depth acceptance (fraction of verify steps
whose accepted path reaches depth d) of the ``weaver`` route and of a ``ddtree`` route with the
same budget and drafter, whether every output equals AR's, and the target mass outside the pool
per depth (``repro.drafters.pool.pool_mass``) on the held-out greedy continuations.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from repro.decoding.routes import resolve_spec
from repro.drafters.dflash import check_fits, load_dflash
from repro.drafters.dflash_model import DFlashDraftModel
from repro.drafters.pool import pool_mass, top_k_pool
from repro.drafters.weaver import random_weaver_for, save_weaver
from repro.drafters.weaver_model import WeaverModel
from repro.errors import ConfigError
from repro.harness.evaluation import route_acceptance
from repro.models.hybrid import HybridLM
from repro.train.common import at_least
from repro.train.distill import (
    Distillation,
    DistillRecipe,
    greedy_continuations,
    target_outputs,
)


@dataclass(kw_only=True)
class WeaverRecipe(DistillRecipe):
    """Everything that decides a Weaver training run (recorded whole in manifest.json)."""

    dflash: str  # the (frozen) DFlash drafter checkpoint
    d_model: int = 64
    heads: int = 4
    intermediate_size: int | None = None  # None: 2 * d_model
    pool_size: int = 512
    tv_weight: float = 0.5
    target_temperature: float = 1.0  # p_j = softmax(target logits / this); -> 0: the greedy token
    anchors: int = 8
    budget: int = 16  # tree budget of the held-out comparison
    width: int = 4

    def __post_init__(self) -> None:
        if not 0.0 <= self.tv_weight <= 1.0:
            raise ConfigError(f"tv_weight must lie in [0, 1], got {self.tv_weight}")
        if not (math.isfinite(self.target_temperature) and self.target_temperature > 0):
            raise ConfigError(f"target_temperature must be finite and > 0, got {self.target_temperature}")
        if self.prompt_len < 2 or self.gen_len < 2:
            raise ConfigError(
                "prompt_len and gen_len must be >= 2 (anchors need a committed token before them)"
            )
        at_least(self, 1, "anchors")
        for name, spec in heldout_specs(self).items():  # the held-out comparison's routes, before training
            resolve_spec({"name": name, **spec})
        super().__post_init__()


def heldout_specs(recipe: WeaverRecipe) -> dict[str, dict[str, Any]]:
    """The held-out comparison's route specs: the trained adapter's tree beside DDTree's, on the same DFlash
    drafter and budget."""
    common = {"drafter": recipe.dflash, "budget": recipe.budget}
    weaver = {"kind": "weaver", "weaver": recipe.out, "width": recipe.width, "pool": recipe.pool_size}
    return {"weaver": {**weaver, **common}, "ddtree": {"kind": "ddtree", **common}}


def weaver_loss(
    weaver: WeaverModel,
    dflash: DFlashDraftModel,
    target: HybridLM,
    seqs: torch.Tensor,
    features: torch.Tensor,
    target_logits: torch.Tensor,
    anchors: torch.Tensor,
    pool_size: int,
    tv_weight: float,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The KL + TV mix (module docstring) on blocks anchored at ``anchors`` [B, A] of ``seqs`` [B, L]."""
    b, length = seqs.shape
    a = anchors.shape[1]
    embedding = target.model.embed_tokens.weight
    with torch.no_grad():
        hidden, positions = dflash.anchored_blocks(seqs, features, anchors, embedding)
        rows = hidden[:, 1:]  # [BA, T-1, dflash hidden]
        pool_logits, pool_ids = top_k_pool(dflash.compute_logits(rows, target.lm_head), pool_size)
        where = positions[:, :-1]  # parent positions a + j - 1, j = 1..T-1
        valid = where <= length - 1
        where = where.clamp(max=length - 1)
        seq = torch.arange(b, device=seqs.device).repeat_interleave(a)
        parents = seqs[seq[:, None], where]
        root_feature = features[seq, anchors.reshape(-1) - 1]  # [BA, F]
        p = torch.softmax(target_logits[seq[:, None], where].float() / temperature, dim=-1)  # [BA, T-1, V]
        p_pool = p.gather(-1, pool_ids)
        inside = p_pool.sum(-1)
    x = weaver.embed(rows, embedding[parents], root_feature[:, None])
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
    u, _ = weaver(x, causal[None])
    logq = weaver.pool_log_probs(u, pool_logits, embedding[pool_ids]).float()
    p_tilde = p_pool / inside.clamp_min(torch.finfo(p_pool.dtype).tiny)[..., None]
    kl = (torch.xlogy(p_tilde, p_tilde) - p_tilde * logq).sum(-1)
    tv = 0.5 * ((p_pool - logq.exp()).abs().sum(-1) + (1.0 - inside))
    return ((1.0 - tv_weight) * kl + tv_weight * tv)[valid].mean()


def train_weaver(recipe: WeaverRecipe) -> dict[str, Any]:
    """Generate the distillation data, train, write the checkpoint and compare against DDTree."""
    started = time.perf_counter()
    with Distillation.start(recipe) as run:
        target, device = run.target, run.device
        dflash = load_dflash(recipe.dflash, dtype=torch.float32, device=device).requires_grad_(False)
        check_fits(dflash.config, target)
        target_logits, features = target_outputs(target, run.seqs, list(dflash.config.target_layer_ids))
        weaver = random_weaver_for(
            dflash, target, seed=recipe.seed, d_model=recipe.d_model, heads=recipe.heads,
            intermediate_size=recipe.intermediate_size, pool_size=recipe.pool_size, zero_residual=True,
        ).train()  # fmt: skip
        weaver.config.extra = {"dflash_checkpoint": str(recipe.dflash)}
        seqs = run.seqs.to(device)

        def step_fn(step: int) -> tuple[torch.Tensor, int]:
            idx, anchors = run.anchored_batch(recipe.anchors)
            loss = weaver_loss(
                weaver, dflash, target, seqs[idx], features[idx], target_logits[idx], anchors,
                recipe.pool_size, recipe.tv_weight, recipe.target_temperature,
            )  # fmt: skip
            return loss, recipe.batch_size * recipe.anchors * (dflash.config.block_size - 1)

        title = f"Weaver adapter (d={recipe.d_model}, K={recipe.pool_size})"
        log = run.train_and_save(weaver, step_fn, save_weaver, title)
        heldout = run.heldout_prompts()
        depth = dflash.config.block_size - 1
        routes = route_acceptance(
            target,
            heldout_specs(recipe),
            heldout,
            recipe.eval_new_tokens,
            recipe.seed,
            depth,
        )
        heldout_seqs = greedy_continuations(target, heldout, recipe.eval_new_tokens)
        mass = pool_mass(target, dflash, heldout_seqs, recipe.pool_size, first_anchor=recipe.prompt_len - 1)
        metrics = {
            "heldout": routes,
            "weaver_mal": routes["weaver"]["mal"],
            "ddtree_mal": routes["ddtree"]["mal"],
            "lossless": all(r["lossless"] for r in routes.values()),
            "pool_mass": mass.to_dict(),
            "budget": recipe.budget,
            "width": recipe.width,
        }
        return run.finish("weaver", weaver, log, metrics, started)
