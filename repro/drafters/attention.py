"""Masked multi-head attention with grouped key/value heads, shared by the drafters."""

from __future__ import annotations

import torch
from torch import nn

HALF = (torch.float16, torch.bfloat16)


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked) v for q [B, H, T, D] and keys/values [B, KV, C, D] (KV divides
    H; query head h reads key head h // (H // KV)); ``mask`` is bool, True = visible, broadcastable to
    [B, H, T, C], or None. The softmax runs in float32 for half inputs. Returns [B, T, H * D].

    The H // KV query heads of a key head are stacked as one [H // KV * T] row block against it, so
    keys and values are read in place, never repeated per query head.
    """
    b, h, t, d = q.shape
    kv, c = keys.shape[1], keys.shape[2]
    groups = h // kv
    scores = q.reshape(b, kv, groups * t, d) @ keys.transpose(-1, -2) * d**-0.5
    if mask is not None:
        scores = scores.view(b, kv, groups, t, c).masked_fill(~_grouped(mask, kv, groups), float("-inf"))
        scores = scores.view(b, kv, groups * t, c)
    attn = torch.softmax(scores.float() if scores.dtype in HALF else scores, dim=-1).to(values.dtype)
    return (attn @ values).view(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)


def _grouped(mask: torch.Tensor, kv: int, groups: int) -> torch.Tensor:
    """A mask broadcastable to [B, H, T, C] as one broadcastable to [B, KV, H // KV, T, C]."""
    while mask.dim() < 4:
        mask = mask[None]
    if mask.shape[1] == 1:
        return mask[:, :, None]
    return mask.reshape(mask.shape[0], kv, groups, *mask.shape[2:])


def marginals(logits: torch.Tensor) -> torch.Tensor:
    """Softmax of draft logits (half precision is lifted to float32 first, inside the softmax's launch)."""
    return torch.softmax(logits, dim=-1, dtype=torch.float32 if logits.dtype in HALF else None)


class ProjectedAttention(nn.Module):
    """The q/k/v/o projections (no bias) of a Llama/Qwen3-style attention with grouped KV heads;
    subclasses add norms, rotary and caching and call :func:`grouped_attention`."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
