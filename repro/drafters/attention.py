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
    [B, H, T, C], or None. The softmax runs in float32 for half inputs. Returns [B, T, H * D]."""
    b, h, t, d = q.shape
    groups = h // keys.shape[1]
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = q @ keys.transpose(-1, -2) * d**-0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    attn = torch.softmax(scores.float() if scores.dtype in HALF else scores, dim=-1).to(values.dtype)
    return (attn @ values).transpose(1, 2).reshape(b, t, h * d)


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
