"""One configuration for every supported target: hybrid GDN + (gated) attention layers.

It is read from, and written to, two native formats:
- ``qwen3_5``: transformers Qwen3.5 / Qwen3.6 layout (``layer_types``, gated attention, partial
  rotary, zero-centred RMSNorm, fused ``in_proj_qkv`` and one depthwise conv over q|k|v);
- ``fla_gdn``: flash-linear-attention ``GatedDeltaNetForCausalLM`` (pure GDN, separate q/k/v
  convs, plain RMSNorm).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from repro.errors import CheckpointError

GDN = "linear_attention"
ATTENTION = "full_attention"
QWEN35_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_6", "qwen3_6_text")
FLA_MODEL_TYPES = ("gated_deltanet",)
DEFAULT_CONTEXT = 32768  # context capacity of a config that states none (tokens)


@dataclass
class HybridConfig:
    """Shapes and options of a hybrid GDN language model (see module docstring)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: list[str]
    rms_norm_eps: float = 1e-6
    zero_centered_norm: bool = True  # Qwen3.5: x * (1 + w); fla: x * w
    tie_word_embeddings: bool = False
    # Gated DeltaNet layers
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    linear_conv_bias: bool = False
    linear_output_gate: bool = True
    linear_norm_eps: float = 1e-6
    allow_neg_eigval: bool = False
    # full-attention layers
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    attention_bias: bool = False
    attention_output_gate: bool = True
    # tokens
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    source_format: str = "qwen3_5"
    max_position_embeddings: int | None = None  # context capacity (prompt + new tokens); None: unknown

    @property
    def context_capacity(self) -> int:
        """Tokens a sequence may hold: the stated capacity, else :data:`DEFAULT_CONTEXT`."""
        return self.max_position_embeddings or DEFAULT_CONTEXT

    def __post_init__(self) -> None:
        for t in self.layer_types:
            if t not in (GDN, ATTENTION):
                raise CheckpointError(f"unsupported layer type {t!r}: expected {GDN!r} or {ATTENTION!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise CheckpointError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        for name in ("bos_token_id", "pad_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [] if value is None else [value]
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
                raise CheckpointError(
                    f"config.json field {name!r} must be a token id >= 0 (or a list of them), got {value!r}"
                )

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def num_gdn_layers(self) -> int:
        return sum(t == GDN for t in self.layer_types)

    @property
    def num_attention_layers(self) -> int:
        return sum(t == ATTENTION for t in self.layer_types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ----- Qwen3.5 / Qwen3.6 (transformers) -----
    @classmethod
    def from_qwen35_dict(cls, raw: dict[str, Any]) -> HybridConfig:
        text = raw.get("text_config") or raw
        try:
            rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
            layers = _positive(text, "num_hidden_layers")
            hidden, heads = _positive(text, "hidden_size"), _positive(text, "num_attention_heads")
            layer_types = text.get("layer_types") or [
                GDN if (i + 1) % _positive(text, "full_attention_interval", 4) else ATTENTION
                for i in range(layers)
            ]
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type not in ("default", "mrope") and rope_type is not None:
                raise CheckpointError(
                    f"unsupported rope_type {rope_type!r} in config.json (only default rotary)"
                )
            eos = text.get("eos_token_id", raw.get("eos_token_id"))
            return cls(
                vocab_size=_positive(text, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_positive(text, "intermediate_size"),
                layer_types=list(layer_types),
                rms_norm_eps=_positive(text, "rms_norm_eps", 1e-6, float),
                zero_centered_norm=True,
                tie_word_embeddings=bool(
                    raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
                ),
                linear_num_key_heads=_positive(text, "linear_num_key_heads", 16),
                linear_num_value_heads=_positive(text, "linear_num_value_heads", 32),
                linear_key_head_dim=_positive(text, "linear_key_head_dim", 128),
                linear_value_head_dim=_positive(text, "linear_value_head_dim", 128),
                linear_conv_kernel_dim=_positive(text, "linear_conv_kernel_dim", 4),
                linear_norm_eps=_positive(text, "rms_norm_eps", 1e-6, float),
                num_attention_heads=heads,
                num_key_value_heads=_positive(text, "num_key_value_heads"),
                head_dim=_positive(text, "head_dim", None) or hidden // heads,
                rope_theta=_positive(rope, "rope_theta", text.get("rope_theta", 10000.0), float),
                partial_rotary_factor=_positive(
                    rope, "partial_rotary_factor", text.get("partial_rotary_factor", 0.25), float
                ),
                attention_bias=bool(text.get("attention_bias", False)),
                bos_token_id=text.get("bos_token_id"),
                eos_token_id=[] if eos is None else eos,
                pad_token_id=text.get("pad_token_id"),
                source_format="qwen3_5",
                max_position_embeddings=_optional_int(text.get("max_position_embeddings")),
            )
        except KeyError as exc:
            raise CheckpointError(f"config.json lacks {exc.args[0]!r} needed for a Qwen3.5 model") from None

    def to_qwen35_dict(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "attention_bias": self.attention_bias,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "max_position_embeddings": self.context_capacity,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }

    # ----- flash-linear-attention GatedDeltaNetForCausalLM -----
    @classmethod
    def from_fla_dict(cls, raw: dict[str, Any]) -> HybridConfig:
        if raw.get("attn"):
            raise CheckpointError(
                "fla GatedDeltaNet checkpoints with attention layers ('attn' in config.json) are not "
                "supported; use a pure-GDN checkpoint or the Qwen3.5 layout for hybrids"
            )
        try:
            hidden = _positive(raw, "hidden_size")
            heads = _positive(raw, "num_heads", 6)
            head_dim = _positive(raw, "head_dim", 256)
            expand_v = _positive(raw, "expand_v", 2.0, float)
            inter = _positive(raw, "intermediate_size", None)
            if inter is None:
                ratio = _positive(raw, "hidden_ratio", None, float) or 4
                inter = int(hidden * ratio * 2 / 3)
                inter = 256 * ((inter + 255) // 256)
            if raw.get("hidden_act", "swish") not in ("swish", "silu"):
                raise CheckpointError(f"unsupported hidden_act {raw.get('hidden_act')!r} (only swish)")
            if raw.get("output_gate_activation", "swish") not in ("swish", "silu"):
                raise CheckpointError("unsupported output_gate_activation (only swish/silu)")
            if not raw.get("use_short_conv", True):
                raise CheckpointError("fla checkpoints without short convolutions are not supported")
            eos = raw.get("eos_token_id", 2)
            return cls(
                vocab_size=_positive(raw, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=int(inter),
                layer_types=[GDN] * _positive(raw, "num_hidden_layers"),
                rms_norm_eps=_positive(raw, "norm_eps", 1e-6, float),
                zero_centered_norm=False,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                linear_num_key_heads=heads,
                linear_num_value_heads=_positive(raw, "num_v_heads", None) or heads,
                linear_key_head_dim=head_dim,
                linear_value_head_dim=int(head_dim * expand_v),
                linear_conv_kernel_dim=_positive(raw, "conv_size", 4),
                linear_conv_bias=False,  # fla's GatedDeltaNetBlock never passes conv_bias to its layer
                linear_output_gate=bool(raw.get("use_gate", True)),
                linear_norm_eps=_positive(raw, "norm_eps", 1e-6, float),
                allow_neg_eigval=bool(raw.get("allow_neg_eigval", False)),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=[] if eos is None else eos,
                pad_token_id=raw.get("pad_token_id"),
                max_position_embeddings=_optional_int(raw.get("max_position_embeddings")),
                source_format="fla_gdn",
            )
        except KeyError as exc:
            raise CheckpointError(
                f"config.json lacks {exc.args[0]!r} needed for an fla GatedDeltaNet model"
            ) from None

    def to_fla_dict(self) -> dict[str, Any]:
        if self.num_attention_layers:
            raise CheckpointError("the fla GatedDeltaNet format holds pure-GDN models only")
        return {
            "architectures": ["GatedDeltaNetForCausalLM"],
            "model_type": "gated_deltanet",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_heads": self.linear_num_key_heads,
            "num_v_heads": self.linear_num_value_heads,
            "head_dim": self.linear_key_head_dim,
            "expand_v": self.linear_value_head_dim / self.linear_key_head_dim,
            "conv_size": self.linear_conv_kernel_dim,
            "use_gate": self.linear_output_gate,
            "use_short_conv": True,
            "allow_neg_eigval": self.allow_neg_eigval,
            "norm_eps": self.rms_norm_eps,
            "hidden_act": "swish",
            "tie_word_embeddings": self.tie_word_embeddings,
            "fuse_norm": True,
            "fuse_swiglu": True,
            "fuse_cross_entropy": True,
            "attn_mode": "chunk",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }


_REQUIRED = object()


def _positive(raw: dict[str, Any], key: str, default: Any = _REQUIRED, kind: type = int) -> Any:
    """``raw[key]`` (or ``default`` when absent; ``None`` passes) as a positive ``kind``: a
    :class:`CheckpointError` naming the field for a string, a fraction where an integer belongs, zero,
    a negative or a non-finite value (a missing required key is a KeyError for the caller)."""
    value = raw[key] if default is _REQUIRED else raw.get(key, default)
    if value is None and default is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value <= 0 or (kind is int and value != int(value)):
        what = "a positive integer" if kind is int else "a positive number"
        raise CheckpointError(f"config.json field {key!r} must be {what}, got {value!r}")
    return kind(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
