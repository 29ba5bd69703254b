"""Masked multi-head attention with grouped key/value heads, shared by the drafters."""

from __future__ import annotations

import torch

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
