"""transformers' own ``generate``: plain AR, and assisted generation (a small assistant model, or
the DFlash drafter with ``speculation_type="dflash"``). A refusal by ``generate`` (transformers
refuses assisted generation on stateful models such as Qwen3.5) is returned as the result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from repro.engines.hf_target import TargetRefused, load_hf_target, torch_dtype
from repro.engines.result import OK, EngineResult, refused, require
from repro.errors import describe


def _config(transformers: Any, max_new_tokens: int, temperature: float, stop_ids: list[int] | None) -> Any:
    """Exactly ``max_new_tokens`` when ``stop_ids`` is None (no end-of-sequence token at all)."""
    sample = temperature > 0
    return transformers.GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_k=None,
        top_p=None,
        eos_token_id=list(stop_ids) if stop_ids else None,
        pad_token_id=(list(stop_ids)[0] if stop_ids else 0),
    )


def _run(
    target: Any,
    note: str,
    prompt_ids: list[int],
    config: Any,
    seed: int,
    dtype: str,
    **kwargs: Any,
) -> EngineResult:
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=target.device)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            out = target.generate(ids, generation_config=config, **kwargs)
    except (ValueError, NotImplementedError, TypeError) as exc:  # generate's own refusals
        return refused(describe(exc, 300), dtype, note)
    wall = time.perf_counter() - t0
    return EngineResult(out[0, len(prompt_ids) :].tolist(), None, wall, OK, dtype, note)


def hf_generate(
    target_dir: str | Path,
    drafter_dir: str | Path | None,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: list[int] | None = None,
    dtype: str = "float64",
    device: str = "cpu",
) -> EngineResult:
    """Plain AR ``generate`` (greedy at temperature 0); ``drafter_dir`` is unused."""
    transformers = require("transformers")
    try:
        target, note = load_hf_target(target_dir, dtype, device)
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    config = _config(transformers, max_new_tokens, temperature, stop_ids)
    return _run(target, note, prompt_ids, config, seed, dtype)


def hf_assisted(
    target_dir: str | Path,
    drafter_dir: str | Path | None,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: list[int] | None = None,
    dtype: str = "float64",
    device: str = "cpu",
) -> EngineResult:
    """Assisted generation with an assistant model loaded from ``drafter_dir`` (a causal LM with the
    target's vocabulary; None: a second copy of the target, the smallest assistant at hand)."""
    transformers = require("transformers")
    try:
        target, note = load_hf_target(target_dir, dtype, device)
        assistant, _ = load_hf_target(drafter_dir or target_dir, dtype, device)
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    config = _config(transformers, max_new_tokens, temperature, stop_ids)
    note += f"; assistant {Path(drafter_dir or target_dir).name}"
    return _run(target, note, prompt_ids, config, seed, dtype, assistant_model=assistant)


def hf_assisted_dflash(
    target_dir: str | Path,
    drafter_dir: str | Path,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: list[int] | None = None,
    dtype: str = "float64",
    device: str = "cpu",
) -> EngineResult:
    """transformers' DFlash speculation (``speculation_type="dflash"``) with the ``dflash`` package's
    ``DFlashDraftModel`` loaded from ``drafter_dir`` as the assistant."""
    transformers = require("transformers")
    zlab = require("dflash.model", "dflash")
    try:
        target, note = load_hf_target(target_dir, dtype, device)
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    try:
        drafter = zlab.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch_dtype(dtype))
    except (ValueError, KeyError, OSError) as exc:
        return refused(f"dflash cannot load {Path(drafter_dir).name}: {describe(exc, 200)}", dtype, note)
    config = _config(transformers, max_new_tokens, temperature, stop_ids)
    config.speculation_type = "dflash"
    note += "; assistant dflash.DFlashDraftModel, speculation_type='dflash'"
    return _run(target, note, prompt_ids, config, seed, dtype, assistant_model=drafter.to(device).eval())
