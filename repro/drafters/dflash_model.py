"""The DFlash drafter network and its config (z-lab's ``DFlashDraftModel``).

A DFlash drafter is a few Qwen3-style transformer layers with no embedding or LM head of its own
(the target's are passed in). Hidden states of the target layers ``target_layer_ids`` (outputs of
those decoder layers, concatenated per token) are projected by ``fc`` and normed by
``hidden_norm``; each draft layer projects them with its own ``k_proj``/``v_proj`` (``k_norm``
and rotary at the tokens' absolute positions) into extra keys/values placed before the block's
own. Queries come from the block ``[last committed token, MASK x (block_size - 1)]`` embedded by
the target; attention is non-causal inside the block and sees every context token. After the
final ``norm``, the target's LM head turns block rows 1..block_size-1 into the marginals of the
next ``block_size - 1`` tokens in one pass.

:class:`DFlashConfig` reads and writes z-lab's ``config.json``; the checkpoints themselves and the
drafter that runs the network are :mod:`repro.drafters.dflash`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from repro.drafters.attention import ProjectedAttention, grouped_attention
from repro.drafters.layers import DraftLayer, DraftRMSNorm, apply_rope, rotary_tables
from repro.errors import CheckpointError, ConfigError

ARCHITECTURE = "DFlashDraftModel"
KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per draft layer: keys, values [B, KV, C, D]


def zlab_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default when config.json has no target_layer_ids: one per draft layer, 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def spread_target_layers(num_target_layers: int, count: int) -> list[int]:
    """``count`` feature layers spread evenly from 1 to L-3 (z-lab's rule; one layer: L // 2).

    Targets too shallow for that span (fewer than count + 3 layers) spread over 0..L-2 instead;
    duplicates are dropped.
    """
    if count < 1 or num_target_layers < 1:
        raise ConfigError(f"need >= 1 target layer and >= 1 feature layer (got {num_target_layers}, {count})")
    if count == 1 or num_target_layers - 3 >= count:
        return zlab_target_layers(num_target_layers, count)
    hi = max(0, num_target_layers - 2)
    return sorted({round(i * hi / (count - 1)) for i in range(count)})


@dataclass
class DFlashConfig:
    """Shapes of a DFlash drafter and the target interface it was built for."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.block_size < 2:
            raise CheckpointError(f"block_size={self.block_size} must be >= 2 (root + at least one mask)")
        if not self.target_layer_ids:
            raise CheckpointError("dflash_config.target_layer_ids is empty")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise CheckpointError(
                f"target_layer_ids {bad} are outside the {self.num_target_layers} target layers"
            )

    def to_dict(self) -> dict[str, Any]:
        """z-lab's config.json (a Qwen3 config with the DFlash keys)."""
        dflash: dict[str, Any] = {
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
        }
        if self.input_embedding_scale != 1.0:
            dflash["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping is not None:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        out = {
            **self.extra,
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": dflash,
        }
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> DFlashConfig:
        """Parse z-lab's config.json; a one-line CheckpointError for what this drafter cannot run."""
        archs = raw.get("architectures") or []
        if ARCHITECTURE not in archs:
            hint = (
                " (DFlash-2 adds convolutions and a candidate selector: not supported)"
                if any("DFlash2" in a for a in archs)
                else ""
            )
            raise CheckpointError(f"{where} is not a {ARCHITECTURE} checkpoint (architectures={archs}){hint}")
        draft = raw.get("dflash_config") or {}

        def value(name: str, default: Any = None) -> Any:
            return draft.get(name, raw.get(name, default))

        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise CheckpointError(f"{where}: unsupported rope_type {rope.get('rope_type')!r} (only default)")
        if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or []):
            raise CheckpointError(f"{where}: sliding-window draft layers are not supported")
        if raw.get("is_causal"):
            raise CheckpointError(f"{where}: causal draft attention (is_causal=true) is not supported")
        if raw.get("attention_bias"):
            raise CheckpointError(f"{where}: attention_bias=true is not supported")
        if raw.get("hidden_act", "silu") not in ("silu", "swish"):
            raise CheckpointError(f"{where}: unsupported hidden_act {raw.get('hidden_act')!r} (only silu)")
        try:
            layers = int(raw["num_hidden_layers"])
            heads = int(raw["num_attention_heads"])
            target_layers = int(raw["num_target_layers"])
            ids = value("target_layer_ids")
            mask = value("mask_token_id")
            if mask is None:
                raise KeyError("mask_token_id")
            softcap = value("final_logit_softcapping")
            cfg = cls(
                hidden_size=int(raw["hidden_size"]),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
                head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                intermediate_size=int(raw["intermediate_size"]),
                vocab_size=int(raw["vocab_size"]),
                num_target_layers=target_layers,
                target_layer_ids=[int(i) for i in ids]
                if ids is not None
                else zlab_target_layers(target_layers, layers),
                mask_token_id=int(mask),
                block_size=int(value("block_size", 16)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
                max_position_embeddings=int(raw.get("max_position_embeddings", 40960)),
                input_embedding_scale=float(value("input_embedding_scale", 1.0)),
                output_multiplier=float(value("output_multiplier", 1.0)),
                final_logit_softcapping=None if softcap is None else float(softcap),
            )
        except KeyError as exc:
            raise CheckpointError(f"{where} lacks {exc.args[0]!r} needed for a DFlash drafter") from None
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: bad value ({exc})") from None
        owned = set(cfg.to_dict()) | {"dtype", "torch_dtype", "transformers_version", "rope_scaling"}
        cfg.extra = {k: v for k, v in raw.items() if k not in owned and not k.startswith("_")}
        return cfg

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features that ``fc`` projects."""
        return len(self.target_layer_ids) * self.hidden_size


class DFlashAttention(ProjectedAttention):
    """Block queries over [context keys/values, block keys/values]; no mask inside the block."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_norm = DraftRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = DraftRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values [B, KV, T, D] of rows x [B, T, hidden]."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Block rows x [B, T, hidden] over the ``context`` keys/values and their own. ``slots`` [T]:
        the context is a preallocated buffer; the block's keys/values are written into it at those
        positions and ``mask`` says which buffer rows are visible (static shapes, no concatenation)."""
        b, t, _ = x.shape
        q = apply_rope(
            self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2), cos, sin
        )
        k_blk, v_blk = self.keys_values(x, cos, sin)
        if slots is None:
            k = torch.cat([context[0], k_blk], dim=2)
            v = torch.cat([context[1], v_blk], dim=2)
        else:
            k = context[0].index_copy_(2, slots, k_blk)
            v = context[1].index_copy_(2, slots, v_blk)
        return self.o_proj(grouped_attention(q, k, v, mask))


class DFlashLayer(DraftLayer):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__(DFlashAttention(cfg), cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, mask, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The DFlash drafter network (parameter names as z-lab's ``DFlashDraftModel``).

    Shapes are batch-first: target features [B, C, len(target_layer_ids) * hidden], block
    embeddings [B, T, hidden], absolute positions [B, C + T] (context first).
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = DraftRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(config.feature_size, config.hidden_size, bias=False)
        self.hidden_norm = DraftRMSNorm(config.hidden_size, config.rms_norm_eps)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_tables(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def context_kv(self, target_hidden: torch.Tensor, positions: torch.Tensor) -> KVCache:
        """Per draft layer, keys/values [B, KV, C, D] of context rows at ``positions`` [B, C].

        Every operation is row-wise, so the cache of a growing context can be extended piecewise.
        """
        ctx = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self._tables(positions, ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward_block(
        self,
        noise_embedding: torch.Tensor,
        positions: torch.Tensor,
        context: KVCache,
        mask: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [B, T, hidden] of the block at ``positions`` [B, T].

        ``mask`` (bool, True = visible, broadcastable to [B, heads, T, C + T]) is for training;
        drafting leaves it None: every block row sees the whole context and the whole block. With
        ``slots`` (static buffers, :mod:`repro.drafters.static_dflash`) the context is each layer's
        key/value buffer [B, KV, max_len, D], the block's keys/values go to buffer rows ``slots`` and
        ``mask`` [.., max_len] says which rows are visible.
        """
        cos, sin = self._tables(positions, noise_embedding.dtype)
        h = noise_embedding
        for layer, kv in zip(self.layers, context):
            h = layer(h, kv, cos, sin, mask, slots)
        return self.norm(h)

    def forward(
        self,
        target_hidden: torch.Tensor,
        noise_embedding: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """z-lab's forward: context features and block embeddings -> block hidden states."""
        if position_ids.dim() == 1:
            position_ids = position_ids[None].expand(noise_embedding.shape[0], -1)
        c = target_hidden.shape[1]
        kv = self.context_kv(target_hidden, position_ids[:, :c])
        return self.forward_block(noise_embedding, position_ids[:, c:], kv, mask)

    def embed_block(self, block_ids: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The block's input rows: the target's embedding of the ids (times input_embedding_scale)."""
        emb = F.embedding(block_ids, embedding)
        scale = self.config.input_embedding_scale
        return emb * scale if scale != 1.0 else emb

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """The target's LM head on draft hidden states (with the optional multiplier and softcap)."""
        return self.shape_logits(lm_head(hidden))

    def shape_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The LM head's ``logits`` times the optional multiplier, then the optional softcap."""
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def block_hidden(
        self, context: KVCache, block_ids: torch.Tensor, positions: torch.Tensor, embedding: torch.Tensor
    ) -> torch.Tensor:
        """Final-normed hidden states [B, T, hidden] of the block ``block_ids`` at ``positions``."""
        return self.forward_block(self.embed_block(block_ids, embedding), positions, context)

    def anchored_blocks(
        self, seqs: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor, embedding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced blocks: hidden states [B*A, T, hidden] and positions [B*A, T].

        Sequence b's block k is ``[seqs[b, a], MASK x (T - 1)]`` at positions a..a+T-1 (a =
        ``anchors[b, k]``); it sees the target ``features`` [B, L, F] of positions < a and the
        whole block, exactly what drafting at a committed length of a sees.
        """
        b, length = seqs.shape
        k, bs = anchors.shape[1], self.config.block_size
        device = seqs.device
        positions = (anchors[..., None] + torch.arange(bs, device=device)).reshape(b * k, bs)
        block = torch.full((b * k, bs), self.config.mask_token_id, dtype=torch.long, device=device)
        block[:, 0] = seqs.gather(1, anchors).reshape(-1)
        context = self.context_kv(features, torch.arange(length, device=device).expand(b, -1))
        context = [(kk.repeat_interleave(k, 0), vv.repeat_interleave(k, 0)) for kk, vv in context]
        visible = torch.arange(length, device=device)[None] < anchors.reshape(-1, 1)  # [BK, L]
        mask = torch.cat([visible, torch.ones(b * k, bs, dtype=torch.bool, device=device)], dim=1)
        hidden = self.forward_block(
            self.embed_block(block, embedding), positions, context, mask[:, None, None]
        )
        return hidden, positions
