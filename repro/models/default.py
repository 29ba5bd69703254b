"""The embedded default target: a tiny Qwen3.5-architecture hybrid with seeded random weights.

Its numbers show the harness's mechanics (acceptance, exactness, records), not model quality.
"""

from __future__ import annotations

import math

import torch

from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.hybrid import HybridLM
from repro.models.tokenizer import ByteTokenizer

DEFAULT_SEED = 0


def tiny_config(vocab_size: int | None = None, layers: int = 4) -> HybridConfig:
    """Qwen3.5 layout at toy size: 3 GDN layers per gated attention layer, grouped value heads."""
    tok = ByteTokenizer()
    return HybridConfig(
        vocab_size=vocab_size or tok.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        layer_types=[GDN if (i + 1) % 4 else ATTENTION for i in range(layers)],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.25,
        eos_token_id=list(tok.stop_token_ids),
        source_format="qwen3_5",
    )


def init_random_weights(model: HybridLM, seed: int) -> HybridLM:
    """Deterministic random weights with unit-scale activations (fan-in scaled).

    The numbers are drawn on the model's device (a CPU model gets the same weights on any
    machine; a model built on a GPU is never copied through host memory).
    """
    device = model.device
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device)

    def rand(shape: torch.Size) -> torch.Tensor:
        return torch.rand(shape, generator=gen, device=device)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=device).uniform_(1.0, 16.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                dt = torch.exp(rand(p.shape) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name.endswith("norm.weight") and p.dim() == 1:
                p.copy_(0.1 * randn(p.shape) + (0.0 if _zero_centered(model, name) else 1.0))
            elif "embed_tokens" in name:
                p.copy_(randn(p.shape))
            elif p.dim() >= 2:
                fan_in = p.shape[-1] if p.dim() == 2 else p.shape[-1] * p.shape[1]
                p.copy_(randn(p.shape) / math.sqrt(fan_in))
            else:
                p.copy_(0.1 * randn(p.shape))
    return model


def _zero_centered(model: HybridLM, name: str) -> bool:
    return model.config.zero_centered_norm and not name.endswith("linear_attn.norm.weight")


def build_default_target(seed: int = DEFAULT_SEED, dtype: torch.dtype = torch.float32) -> HybridLM:
    """The embedded default: same seed, same weights, on any machine."""
    model = HybridLM(tiny_config())
    init_random_weights(model, seed)
    return model.to(dtype).eval()
