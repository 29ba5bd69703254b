"""Drafters at the papers' real shapes, with random weights drawn on the device (``repro bench scale``).

- DFlash of the 27B target: 5 layers, hidden 5120, 32 query / 8 KV heads of 128, intermediate 17408,
  5 feature layers [1, 16, 31, 46, 61] (z-lab's spread over 1..L-3), block 16, rope theta 1e7: a
  public ``DFlashDraftModel`` config.json for a 64-layer, width-5120, vocab-248320 target (Qwen3.5-27B's
  shape; huggingface.co/HyzeAI/Hyze1B/config.json). Its 1.7B parameters are drawn on the device.
  At the other shapes: ``random_dflash_for`` (one layer at the target width, two feature layers; no
  public DFlash drafter of a GDN-1.3B target is known).
- Weaver: one layer, d = 2048, 16 heads, pool K = 512 (the paper's Sec. 3.2 / 3.3), intermediate 2 d;
  its input projections follow the DFlash drafter's feature width, so its parameter count differs
  from the paper's 56.7M (:func:`drafter_info` records it).
- EAGLE at the GDN-1.3B shape: one Llama-style decoder layer at the target's width 2048 with 16
  heads of 128 (a 2048-wide Llama's attention; the pure-GDN target has no attention shape to copy),
  intermediate 5632 (the target's MLP), reading the last layer's features: SpecLA's drafter.
  Elsewhere ``random_eagle_for`` (one layer shaped by the target's attention layers).
- ``tiny``: every ``random_*_for`` default.

:func:`growth_problem` draws one Weaver growth's weights and inputs at a named shape (the growth kernel's
tests and benches).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from repro.drafters.base import Drafter
from repro.drafters.dflash_model import DFlashConfig, DFlashDraftModel, spread_target_layers
from repro.drafters.eagle import EagleConfig, EagleDraftModel
from repro.drafters.pool import top_k_pool
from repro.drafters.weaver import random_weaver_for
from repro.drafters.weaver_model import WeaverConfig, WeaverModel
from repro.models.config import HybridConfig
from repro.models.hybrid import HybridLM

# huggingface.co/HyzeAI/Hyze1B/config.json: a DFlash drafter of a Qwen3.5-27B-shaped target
QWEN27B_DFLASH = {
    "hidden_size": 5120,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 17408,
    "rope_theta": 1e7,
    "mask_token_id": 248070,
}
GDN13B_EAGLE = {"num_hidden_layers": 1, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128}
WEAVER_SHAPE = {"d_model": 2048, "heads": 16, "pool_size": 512}  # the paper's Sec. 3.2 / 3.3


def device_model(
    cls: type[torch.nn.Module], cfg: Any, device: torch.device, dtype: torch.dtype, seed: int
) -> Any:
    """``cls(cfg)`` with seeded draft weights drawn on ``device`` (the law of ``init_draft_weights``:
    matrices N(0, 1/fan_in), other weights 1 + 0.1 N(0, 1)), then cast to ``dtype``."""
    with torch.device(device):
        model = cls(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            draw = torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype)
            p.copy_(draw / math.sqrt(p.shape[1]) if p.dim() == 2 else 1.0 + 0.1 * draw)
    return model.to(dtype=dtype).eval().requires_grad_(False)


def qwen27b_dflash_config(tc: HybridConfig, block_size: int = 16) -> DFlashConfig:
    """The DFlash drafter's config at its public shape (:data:`QWEN27B_DFLASH`) for target config ``tc``."""
    shape = dict(QWEN27B_DFLASH)
    if shape["mask_token_id"] >= tc.vocab_size:
        shape["mask_token_id"] = tc.vocab_size - 1
    return DFlashConfig(
        **shape,
        vocab_size=tc.vocab_size,
        num_target_layers=tc.num_hidden_layers,
        target_layer_ids=spread_target_layers(tc.num_hidden_layers, shape["num_hidden_layers"]),
        block_size=block_size,
        rms_norm_eps=tc.rms_norm_eps,
    )


def qwen27b_dflash(target: HybridLM, seed: int = 0, block_size: int = 16) -> DFlashDraftModel:
    """The DFlash drafter of the 27B target at its public shape, weights drawn on the target's device."""
    cfg = qwen27b_dflash_config(target.config, block_size)
    return device_model(DFlashDraftModel, cfg, target.device, target.dtype, seed)


def gdn13b_eagle_config(tc: HybridConfig) -> EagleConfig:
    """The EAGLE drafter's config at the GDN-1.3B shape (:data:`GDN13B_EAGLE`) for target config ``tc``."""
    return EagleConfig(
        **GDN13B_EAGLE,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        vocab_size=tc.vocab_size,
        target_layer_ids=[tc.num_hidden_layers - 1],
        target_hidden_size=tc.hidden_size,
        rms_norm_eps=tc.rms_norm_eps,
    )


def gdn13b_eagle(target: HybridLM, seed: int = 0) -> EagleDraftModel:
    """SpecLA's EAGLE drafter at the GDN-1.3B shape, weights drawn on the target's device."""
    return device_model(
        EagleDraftModel, gdn13b_eagle_config(target.config), target.device, target.dtype, seed
    )


def drafter_constructors(shape: str) -> dict[str, Callable[..., Any]]:
    """``build_route``'s constructors of random drafters at ``shape`` (see the module docstring)."""
    if shape == "tiny":
        return {}
    out: dict[str, Callable[..., Any]] = {"weaver": partial(random_weaver_for, **WEAVER_SHAPE)}
    if shape == "qwen3.6-27b":
        out["dflash"] = qwen27b_dflash
    if shape == "gdn-1.3b":
        out["eagle"] = gdn13b_eagle
    return out


def params_of(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def drafter_info(d: Drafter | None) -> dict[str, Any]:
    """The shapes and parameter counts of a drafter's models (DFlash, Weaver, EAGLE)."""
    if d is None:
        return {}
    out: dict[str, Any] = {}
    dflash = getattr(d, "dflash", d if hasattr(d, "block_size") else None)
    if dflash is not None:
        c = dflash.model.config
        out["dflash"] = {
            "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "intermediate": c.intermediate_size,
            "target_layer_ids": list(c.target_layer_ids), "block_size": dflash.block_size,
            "params": params_of(dflash.model),
        }  # fmt: skip
    if hasattr(d, "weaver"):
        c = d.weaver.config
        out["weaver"] = {
            "d_model": c.d_model, "heads": c.num_heads, "intermediate": c.intermediate_size, "pool": d.pool,
            "params": params_of(d.weaver),
        }  # fmt: skip
    if dflash is None and hasattr(d, "model"):
        c = d.model.config
        out["eagle"] = {
            "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim, "intermediate": c.intermediate_size,
            "target_layer_ids": list(c.target_layer_ids), "params": params_of(d.model),
        }  # fmt: skip
    return out


def growth_shape(shape: str, vocab: int = 2048) -> tuple[WeaverConfig, int]:
    """The Weaver config and budget of a named growth shape: ``tiny`` (the tiny family's Weaver: d_model
    128, 4 heads, intermediate 256, target hidden 192, pool 512, budget 32) or ``qwen3.6-27b``
    (:data:`WEAVER_SHAPE` over the 27B target's hidden 5120: d_model 2048, 16 heads, intermediate 4096,
    pool 512, budget 64); 15 depths (DFlash block 16), ``vocab`` embedding rows (scaled down: only the
    pool's rows are read)."""
    if shape == "tiny":
        d, heads, hidden, pool, budget = 128, 4, 192, 512, 32
    elif shape == "qwen3.6-27b":
        d, heads, pool, budget = WEAVER_SHAPE["d_model"], WEAVER_SHAPE["heads"], WEAVER_SHAPE["pool_size"], 64
        hidden = QWEN27B_DFLASH["hidden_size"]
    else:
        raise ValueError(f"unknown growth shape {shape!r} (tiny, qwen3.6-27b)")
    cfg = WeaverConfig(
        d_model=d, num_heads=heads, intermediate_size=2 * d, pool_size=pool, block_size=16, vocab_size=vocab,
        target_hidden_size=hidden, target_feature_size=2 * hidden, dflash_hidden_size=hidden,
    )  # fmt: skip
    return cfg, budget


def growth_problem(
    shape: str, dtype: torch.dtype, device: torch.device, seed: int = 0, vocab: int = 2048
) -> tuple:
    """Random weights and inputs of one growth at a named shape (:func:`growth_shape`), drawn on
    ``device``. Returns :func:`~repro.drafters.growth_kernels.grow_fused`'s positional arguments (weaver,
    embedding, budget, root [1], rows, pool_logits, pool_ids, feature)."""
    cfg, budget = growth_shape(shape, vocab)
    depth = cfg.block_size - 1
    weaver = device_model(WeaverModel, cfg, device, dtype, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    emb = torch.randn(vocab, cfg.target_hidden_size, generator=gen, device=device).to(dtype)
    rows = torch.randn(depth, cfg.dflash_hidden_size, generator=gen, device=device).to(dtype)
    feature = torch.randn(cfg.target_feature_size, generator=gen, device=device).to(dtype)
    logits = (2 * torch.randn(depth, vocab, generator=gen, device=device)).to(dtype)
    root = torch.randint(0, vocab, (1,), generator=gen, device=device)
    return (weaver, emb, budget, root, rows, *top_k_pool(logits, cfg.pool_size), feature)
