"""Resolve a target spec ("default", a family name, "tiny-random" or a checkpoint directory) to a model
and its tokenizer."""

from __future__ import annotations

import re

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


def auto_dtype(device: str) -> str:
    """The ``auto`` dtype: bfloat16 on CUDA (a large checkpoint is never widened to float32), else float32."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device_name(name: str) -> str:
    """``name`` when it is a device name repro takes (auto, cpu, cuda, cuda:N), else one ConfigError."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto")
    return name


def resolve_device(name: str) -> str:
    """``name`` checked (:func:`check_device_name`), ``auto`` made CUDA when present, else cpu; a CUDA
    device where there is none is one ConfigError."""
    if check_device_name(name) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but no CUDA GPU is available here; use --device cpu")
    return name


def open_target(
    spec: str,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    need_tokenizer: bool = True,
) -> tuple[HybridLM, Tokenizer | None]:
    """``default`` is the embedded trained ``tiny-qwen35``; ``tiny-random`` builds the untrained
    seeded hybrid (byte tokenizer); any other family name or a local checkpoint path loads it.

    ``dtype`` ``auto`` is bfloat16 on CUDA, else float32. Without ``need_tokenizer`` a checkpoint
    without tokenizer files gives ``None`` for the tokenizer. A tokenizer larger than the model's
    vocabulary is refused; a smaller one is fine (ids it lacks decode as ``<|id:N|>``)."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(auto_dtype(dev) if dtype == "auto" else dtype)
    if spec == RANDOM_TARGET:
        model = build_default_target(seed=seed, dtype=torch_dtype)
        tokenizer = load_tokenizer(None)
    else:
        path = resolve_checkpoint(DEFAULT_TARGET if spec == "default" else spec, "target")
        model = load_target(path, dtype=torch_dtype, device=dev)
        tokenizer = load_tokenizer(path, optional=not need_tokenizer)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"tokenizer of {spec} has {tokenizer.vocab_size} tokens but the model's vocabulary is "
            f"{model.config.vocab_size}: tokenizer and weights do not belong together"
        )
    return model.to(dev), tokenizer
