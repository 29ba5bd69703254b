"""Committed decoding state of a hybrid model: per layer, GDN state + conv window, or KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class GDNLayerState:
    """Recurrent state [HV, d_v, d_k] and the last W-1 conv inputs [W-1, C] (oldest first)."""

    recurrent: torch.Tensor
    conv: torch.Tensor


@dataclass
class AttentionLayerState:
    """Keys and values [L, H_kv, head_dim] of the committed tokens (rotary applied to keys)."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class ModelState:
    """Everything the target has folded in: ``position`` committed tokens."""

    layers: list[GDNLayerState | AttentionLayerState]
    position: int = 0
    committed_tokens: list[int] = field(default_factory=list)

    def clone(self) -> ModelState:
        layers: list[GDNLayerState | AttentionLayerState] = []
        for s in self.layers:
            if isinstance(s, GDNLayerState):
                layers.append(GDNLayerState(s.recurrent.clone(), s.conv.clone()))
            else:
                layers.append(AttentionLayerState(s.keys.clone(), s.values.clone()))
        return ModelState(layers, self.position, list(self.committed_tokens))
