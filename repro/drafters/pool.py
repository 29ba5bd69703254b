"""The DFlash candidate pool (top-K tokens per draft depth) and how much target mass it holds.

Weaver only ever proposes pool tokens, so the target's probability mass outside the pool is
mass no Weaver tree can reach. :func:`pool_mass` measures it on given sequences, per draft depth,
with teacher forcing: for every anchor a (the pending root at position a, context = the target
features of positions < a, exactly what drafting sees), block row j's pool is compared with the
target's next-token distribution at position a + j - 1 along the sequence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from repro.drafters.dflash_model import DFlashDraftModel
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM
from repro.models.topk_kernels import row_topk


def top_k_pool(logits: torch.Tensor, pool_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool logits and token ids [..., K] of draft ``logits`` [..., V], best first (K <= V)."""
    if pool_size < 1:
        raise ConfigError(f"pool size must be >= 1, got {pool_size}")
    return row_topk(logits, min(pool_size, logits.shape[-1]))


@dataclass
class PoolMass:
    """Per draft depth (1 first): the target mass outside the pool (mean, median, 90th percentile =
    1 - the 10th percentile of the kept mass) and the tail share."""

    pool_size: int
    threshold: float  # a position is in the tail when the pool retains less than this share
    mean_outside: list[float]
    share_below: list[float]  # share of positions whose pool retains < threshold of the mass
    positions: list[int]  # positions measured per depth
    median_outside: list[float] = field(default_factory=list)
    p90_outside: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, pool_size: int, per_depth: list[torch.Tensor], threshold: float = 0.9) -> PoolMass:
        """The statistics of per-depth outside-mass values (one tensor of positions per depth)."""

        def stat(f: Any) -> list[float]:
            return [float(f(v.double())) if v.numel() else float("nan") for v in per_depth]

        return cls(
            pool_size=pool_size,
            threshold=threshold,
            mean_outside=stat(torch.mean),
            share_below=stat(lambda v: (v > 1.0 - threshold).double().mean()),
            positions=[int(v.numel()) for v in per_depth],
            median_outside=stat(lambda v: torch.quantile(v, 0.5)),
            p90_outside=stat(lambda v: torch.quantile(v, 0.9)),
        )


@torch.no_grad()
def outside_mass(
    target: HybridLM,
    dflash: DFlashDraftModel,
    seqs: torch.Tensor,
    pool_sizes: list[int],
    first_anchor: int = 1,
    batch: int = 4,
) -> dict[int, list[torch.Tensor]]:
    """Per pool size K: per draft depth, the target mass outside DFlash's top-K pool at every anchor of
    ``seqs`` [N, L] (teacher-forced; one forward pass for every K: the pools of smaller K are prefixes
    of the largest's, best first).

    Anchors are every position a in [first_anchor, L - 1]; depth j counts where a + j - 1 <= L - 1.
    ``batch`` sequences go through the target and the drafter at a time (the drafter's logits
    take batch * anchors * (block_size - 1) * V floats).
    """
    n, length = seqs.shape
    if not 1 <= first_anchor < length:
        raise ConfigError(f"first_anchor must lie in [1, {length - 1}] for sequences of {length} tokens")
    vocab = target.config.vocab_size
    sizes = sorted({min(int(k), vocab) for k in pool_sizes})
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"pool sizes must be >= 1, got {pool_sizes}")
    layers = tuple(dflash.config.target_layer_ids)
    depth = dflash.config.block_size - 1
    outside: dict[int, list[list[torch.Tensor]]] = {k: [[] for _ in range(depth)] for k in sizes}
    device = target.device
    for start in range(0, n, batch):
        part = seqs[start : start + batch].to(device)
        b = part.shape[0]
        logits, hidden = target.forward_train_hidden(part, layers)
        features = torch.cat([hidden[i] for i in layers], dim=-1).to(dflash.dtype)
        anchors = torch.arange(first_anchor, length, device=device).expand(b, -1)
        block, positions = dflash.anchored_blocks(part, features, anchors, target.model.embed_tokens.weight)
        draft = dflash.compute_logits(block[:, 1:], target.lm_head)  # [bA, T-1, V]
        _, ids = top_k_pool(draft, sizes[-1])
        probs = torch.softmax(logits.double(), dim=-1).reshape(b * length, -1)
        seq = torch.arange(b, device=device).repeat_interleave(anchors.shape[1])
        where = positions[:, :-1]  # the target's distribution at a + j - 1 predicts depth j
        rows = seq[:, None] * length + where.clamp(max=length - 1)
        kept = probs[rows[..., None], ids].cumsum(-1)  # [bA, T-1, K_max]: mass of the top-k, k = 1..
        for k in sizes:
            inside = kept[..., k - 1]
            for j in range(depth):
                keep = where[:, j] <= length - 1
                outside[k][j].append((1.0 - inside[keep, j]).clamp(min=0.0).cpu())
    return {k: [torch.cat(o) for o in per_depth] for k, per_depth in outside.items()}


def pool_mass(
    target: HybridLM,
    dflash: DFlashDraftModel,
    seqs: torch.Tensor,
    pool_size: int,
    first_anchor: int = 1,
    threshold: float = 0.9,
    batch: int = 4,
) -> PoolMass:
    """Target mass outside DFlash's top-``pool_size`` pool on ``seqs`` [N, L], per draft depth
    (:func:`outside_mass` for one K, summarised)."""
    ((k, values),) = outside_mass(target, dflash, seqs, [pool_size], first_anchor, batch).items()
    return PoolMass.of(k, values, threshold)
