"""Resolve a target spec ("default", a family name, "tiny-random" or a checkpoint directory) to a model
and its tokenizer."""

from __future__ import annotations

import torch

from repro.errors import CheckpointError, ConfigError
from repro.models.default import build_default_target
from repro.models.family import DEFAULT_TARGET, RANDOM_TARGET, resolve_checkpoint
from repro.models.hybrid import HybridLM
from repro.models.loading import load_target
from repro.models.tokenizer import Tokenizer, load_tokenizer

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but no CUDA GPU is available here; use --device cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"unknown device {name!r}: use cpu, cuda or auto")
    return name


def open_target(
    spec: str, dtype: str = "float32", device: str = "cpu", seed: int = 0
) -> tuple[HybridLM, Tokenizer]:
    """``default`` is the embedded trained ``tiny-qwen35``; ``tiny-random`` builds the untrained
    seeded hybrid (byte tokenizer); any other family name or a local checkpoint path loads it."""
    torch_dtype, dev = resolve_dtype(dtype), resolve_device(device)
    if spec == RANDOM_TARGET:
        model = build_default_target(seed=seed, dtype=torch_dtype)
        tokenizer = load_tokenizer(None)
    else:
        path = resolve_checkpoint(DEFAULT_TARGET if spec == "default" else spec, "target")
        model = load_target(path, dtype=torch_dtype, device=dev)
        tokenizer = load_tokenizer(path)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"tokenizer of {spec} has {tokenizer.vocab_size} tokens but the model's vocabulary is "
            f"{model.config.vocab_size}: tokenizer and weights do not belong together"
        )
    return model.to(dev), tokenizer
