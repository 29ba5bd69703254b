"""Load and save targets in their native formats from/to a local directory.

Formats: transformers Qwen3.5/Qwen3.6 (``config.json`` + ``*.safetensors``, weights under
``model.`` or ``model.language_model.``) and flash-linear-attention GatedDeltaNetForCausalLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from repro.errors import CheckpointError
from repro.models.config import FLA_MODEL_TYPES, QWEN35_MODEL_TYPES, HybridConfig
from repro.models.family import resolve_checkpoint
from repro.models.hybrid import HybridLM

SUPPORTED = ", ".join(QWEN35_MODEL_TYPES + FLA_MODEL_TYPES)


def read_config(path: Path) -> HybridConfig:
    """Parse ``path/config.json`` into a HybridConfig, or raise a one-line CheckpointError."""
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(
            f"checkpoint {path} has no config.json: is this a transformers-format directory?"
        )
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_file} does not hold a JSON object")
    model_type = raw.get("model_type")
    if model_type in QWEN35_MODEL_TYPES:
        return HybridConfig.from_qwen35_dict(raw)
    if model_type in FLA_MODEL_TYPES:
        return HybridConfig.from_fla_dict(raw)
    raise CheckpointError(
        f"unsupported architecture model_type={model_type!r} in {cfg_file}; supported: {SUPPORTED}"
    )


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {path} has no *.safetensors weight files")
    index = path / "model.safetensors.index.json"
    if index.exists():
        wanted = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(w for w in wanted if not (path / w).exists())
        if missing:
            raise CheckpointError(f"checkpoint {path} is incomplete: missing shard(s) {', '.join(missing)}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises several types for corrupt files
            raise CheckpointError(f"cannot read weight file {f}: {str(exc).splitlines()[0]}") from None
    return weights


def weight_names(path: Path) -> set[str]:
    """The tensor names in ``path``'s safetensors files, read from their headers (no weights loaded)."""
    names: set[str] = set()
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as handle:
                names.update(handle.keys())
        except Exception as exc:  # safetensors raises several types for corrupt files
            raise CheckpointError(f"cannot read weight file {f}: {str(exc).splitlines()[0]}") from None
    return names


def write_weights(weights: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``weights`` (moved to CPU, floating tensors cast to ``dtype``) as one safetensors file. A
    tensor that is a view of a larger storage (a model's projections once a static decoder stacked them:
    :func:`repro.models.static_layers.stacked_rows`) is written from a copy of its own."""
    out = {}
    for k, v in weights.items():
        cast = dtype if dtype is not None and v.is_floating_point() else v.dtype
        t = v.detach().cpu().to(cast).contiguous()
        out[k] = t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t
    save_file(out, str(path), metadata={"format": "pt"})
    return path


def write_checkpoint(
    model: Any,
    path: str | Path,
    dtype: torch.dtype | None = None,
    dtype_key: str = "dtype",
    weights_file: str = "model.safetensors",
) -> Path:
    """A drafter checkpoint folder: ``config.json`` (``model.config.to_dict()`` with the weights' dtype
    under ``dtype_key``) and the state dict in ``dtype`` (default the model's) as one safetensors file."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.dtype
    cfg = {**model.config.to_dict(), dtype_key: str(dtype).removeprefix("torch.")}
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_weights(model.state_dict(), path / weights_file, dtype)
    return path


def read_json_config(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path/config.json`` of a ``what`` checkpoint, or a one-line CheckpointError."""
    if not path.exists():
        raise CheckpointError(f"{what} checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{what} checkpoint path {path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{what} checkpoint {path} has no config.json")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_file} does not hold a JSON object")
    return raw


def check_names(found: set[str], expected: set[str], what: str) -> None:
    """A one-line CheckpointError naming a few weights when ``found`` lacks some of ``expected`` or
    holds others (e.g. config.json's num_hidden_layers smaller than the layers stored)."""
    for problem, names in (
        ("is incomplete: missing", sorted(expected - found)),
        ("has weights this architecture (its config.json) lacks:", sorted(found - expected)),
    ):
        if names:
            more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
            raise CheckpointError(f"{what} {problem} {', '.join(names[:3])}{more}")


def assign_weights(model: nn.Module, path: Path, what: str) -> torch.dtype:
    """Load ``path``'s weights into ``model`` (built on the meta device) under its own parameter
    names, after checking that no name is missing or extra and every shape matches; returns the
    weights' dtype."""
    weights = read_weights(path)
    expected = model.state_dict()
    check_names(set(weights), set(expected), f"{what} checkpoint {path}")
    for name, w in expected.items():
        if weights[name].shape != w.shape:
            raise CheckpointError(
                f"{what} checkpoint {path}: weight {name} has shape {tuple(weights[name].shape)}, "
                f"config.json implies {tuple(w.shape)}"
            )
    model.load_state_dict(weights, strict=True, assign=True)
    return next(iter(weights.values())).dtype


def qwen35_to_internal(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip multimodal prefixes and drop weights a text model does not use (vision, MTP)."""
    out = {}
    for name, w in weights.items():
        if name.startswith(("mtp.", "model.visual.", "visual.")):
            continue
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        out[name] = w
    return out


def fla_to_internal(weights: dict[str, torch.Tensor], cfg: HybridConfig) -> dict[str, torch.Tensor]:
    """Map fla GatedDeltaNetForCausalLM names onto the internal (Qwen3.5-like) names."""
    out: dict[str, torch.Tensor] = {}
    try:
        out["model.embed_tokens.weight"] = weights["model.embeddings.weight"]
        out["model.norm.weight"] = weights["model.norm.weight"]
        if "lm_head.weight" in weights:
            out["lm_head.weight"] = weights["lm_head.weight"]
        for i in range(cfg.num_hidden_layers):
            src, dst = f"model.layers.{i}.", f"model.layers.{i}."
            out[dst + "input_layernorm.weight"] = weights[src + "attn_norm.weight"]
            out[dst + "post_attention_layernorm.weight"] = weights[src + "mlp_norm.weight"]
            for p in ("gate_proj", "up_proj", "down_proj"):
                out[dst + f"mlp.{p}.weight"] = weights[src + f"mlp.{p}.weight"]
            a, b = src + "attn.", dst + "linear_attn."
            out[b + "in_proj_qkv.weight"] = torch.cat([weights[a + f"{x}_proj.weight"] for x in "qkv"], dim=0)
            out[b + "conv1d.weight"] = torch.cat([weights[a + f"{x}_conv1d.weight"] for x in "qkv"], dim=0)
            if cfg.linear_conv_bias:
                out[b + "conv1d.bias"] = torch.cat([weights[a + f"{x}_conv1d.bias"] for x in "qkv"], dim=0)
            if cfg.linear_output_gate:
                out[b + "in_proj_z.weight"] = weights[a + "g_proj.weight"]
            out[b + "in_proj_a.weight"] = weights[a + "a_proj.weight"]
            out[b + "in_proj_b.weight"] = weights[a + "b_proj.weight"]
            out[b + "A_log"] = weights[a + "A_log"]
            out[b + "dt_bias"] = weights[a + "dt_bias"]
            out[b + "norm.weight"] = weights[a + "o_norm.weight"]
            out[b + "out_proj.weight"] = weights[a + "o_proj.weight"]
    except KeyError as exc:
        raise CheckpointError(f"fla checkpoint is incomplete: missing weight {exc.args[0]!r}") from None
    return out


def internal_to_fla(state: dict[str, torch.Tensor], cfg: HybridConfig) -> dict[str, torch.Tensor]:
    """Inverse of :func:`fla_to_internal`."""
    out: dict[str, torch.Tensor] = {
        "model.embeddings.weight": state["model.embed_tokens.weight"],
        "model.norm.weight": state["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    sizes = [kd, kd, cfg.linear_num_value_heads * cfg.linear_value_head_dim]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"model.layers.{i}."
        out[dst + "attn_norm.weight"] = state[src + "input_layernorm.weight"]
        out[dst + "mlp_norm.weight"] = state[src + "post_attention_layernorm.weight"]
        for p in ("gate_proj", "up_proj", "down_proj"):
            out[dst + f"mlp.{p}.weight"] = state[src + f"mlp.{p}.weight"]
        a, b = src + "linear_attn.", dst + "attn."
        for x, w in zip("qkv", state[a + "in_proj_qkv.weight"].split(sizes, dim=0)):
            out[b + f"{x}_proj.weight"] = w
        for x, w in zip("qkv", state[a + "conv1d.weight"].split(sizes, dim=0)):
            out[b + f"{x}_conv1d.weight"] = w
        if cfg.linear_conv_bias:
            for x, w in zip("qkv", state[a + "conv1d.bias"].split(sizes, dim=0)):
                out[b + f"{x}_conv1d.bias"] = w
        if cfg.linear_output_gate:
            out[b + "g_proj.weight"] = state[a + "in_proj_z.weight"]
        out[b + "a_proj.weight"] = state[a + "in_proj_a.weight"]
        out[b + "b_proj.weight"] = state[a + "in_proj_b.weight"]
        out[b + "A_log"] = state[a + "A_log"]
        out[b + "dt_bias"] = state[a + "dt_bias"]
        out[b + "o_norm.weight"] = state[a + "norm.weight"]
        out[b + "o_proj.weight"] = state[a + "out_proj.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def load_target(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> HybridLM:
    """Load a target model from a local checkpoint directory (or an embedded family name) in either
    native format."""
    path = resolve_checkpoint(path, "target")
    cfg = read_config(path)
    weights = read_weights(path)
    if cfg.source_format == "fla_gdn":
        weights = fla_to_internal(weights, cfg)
    else:
        weights = qwen35_to_internal(weights)
    model = build_empty(cfg, dtype, device)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    check_names(set(weights), set(expected), f"checkpoint {path}")
    for name, w in expected.items():
        if weights[name].shape != w.shape:
            raise CheckpointError(
                f"checkpoint {path}: weight {name} has shape {tuple(weights[name].shape)}, "
                f"config.json implies {tuple(w.shape)}"
            )
    model.load_state_dict(weights, strict=False)  # names checked above; a tied lm_head is not stored
    return model.to(device=device, dtype=dtype).eval()


def build_empty(cfg: HybridConfig, dtype: torch.dtype, device: str) -> HybridLM:
    """HybridLM created directly on ``device`` in ``dtype`` (its weights are overwritten next), so that
    a large checkpoint is never held on the host in float32."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return HybridLM(cfg)
    finally:
        torch.set_default_dtype(before)


def save_target(
    model: HybridLM, path: str | Path, fmt: str | None = None, dtype: torch.dtype | None = None
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the model's native format (or ``fmt``),
    weights in ``dtype`` (default: the model's)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    fmt = fmt or cfg.source_format
    state = model.state_dict()
    if fmt == "fla_gdn":
        config_dict, weights = cfg.to_fla_dict(), internal_to_fla(state, cfg)
    elif fmt == "qwen3_5":
        config_dict = cfg.to_qwen35_dict()
        weights = {k: v for k, v in state.items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    else:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}: use qwen3_5 or fla_gdn")
    (path / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    write_weights(weights, path / "model.safetensors", dtype)
    return path
