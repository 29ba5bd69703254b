"""The pieces the draft transformers share (DFlash, EAGLE, Weaver): RMSNorm, the rotary tables and their
application, the pre-norm decoder layer's shell and seeded weights."""

from __future__ import annotations

import math

import torch
from torch import nn

from repro.drafters.attention import HALF
from repro.models.layers import MLP, rotate_half


class DraftRMSNorm(nn.Module):
    """RMSNorm scaled by w (Qwen3); half-precision inputs are normalised in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() if x.dtype in HALF else x
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, T, head_dim] for absolute ``positions`` [B, T] (angles in float64)."""
    inv = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    )
    freqs = positions.to(torch.float64)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class DraftLayer(nn.Module):
    """A pre-norm decoder layer of a drafter: ``self_attn``, SwiGLU ``mlp`` and their two RMSNorms
    (checkpoint names as Llama/Qwen3); subclasses define ``forward``."""

    def __init__(self, attention: nn.Module, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = DraftRMSNorm(hidden, eps)
        self.post_attention_layernorm = DraftRMSNorm(hidden, eps)


def init_draft_weights(model: nn.Module, seed: int) -> nn.Module:
    """Seeded draft-model weights: matrices N(0, 1/fan_in), norm weights 1 + 0.1 N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model
