"""transformers' own ``generate``: plain AR, and assisted generation (a small assistant model, or
the DFlash drafter with ``speculation_type="dflash"``). A refusal by ``generate`` (transformers
refuses assisted generation on stateful models such as Qwen3.5) is returned as the result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from repro.engines.hf_target import TargetRefused, held_hf_target, perturbed, torch_dtype
from repro.engines.result import OK, EngineRequest, EngineResult, refused, require
from repro.errors import describe


def _config(transformers: Any, request: EngineRequest) -> Any:
    """Exactly ``max_new_tokens`` when ``stop_ids`` is None (no end-of-sequence token at all)."""
    sample = request.temperature > 0
    stop_ids = request.stop_ids
    return transformers.GenerationConfig(
        max_new_tokens=request.max_new_tokens,
        do_sample=sample,
        temperature=request.temperature if sample else None,
        top_k=None,
        top_p=None,
        eos_token_id=list(stop_ids) if stop_ids else None,
        pad_token_id=(list(stop_ids)[0] if stop_ids else 0),
    )


def _run(target: Any, note: str, request: EngineRequest, config: Any, **kwargs: Any) -> EngineResult:
    prompt_ids = request.prompt_ids
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=target.device)
    torch.manual_seed(request.seed)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            out = target.generate(ids, generation_config=config, **kwargs)
    except (ValueError, NotImplementedError, TypeError) as exc:  # generate's own refusals
        return refused(describe(exc, 300), request.dtype, note)
    except Exception as exc:  # generate failing on this model is a finding too, recorded with its reason
        return refused(f"generate failed: {describe(exc, 300)}", request.dtype, note)
    wall = time.perf_counter() - t0
    return EngineResult(out[0, len(prompt_ids) :].tolist(), None, wall, OK, request.dtype, note)


def hf_generate(request: EngineRequest) -> EngineResult:
    """Plain AR ``generate`` (greedy at temperature 0); ``drafter_dir`` is unused."""
    transformers = require("transformers")
    try:
        target, note = held_hf_target(request.target_dir, request.dtype, request.device)
    except TargetRefused as exc:
        return refused(str(exc), request.dtype)
    return _run(target, note, request, _config(transformers, request))


def hf_assisted(request: EngineRequest) -> EngineResult:
    """Assisted generation with an assistant model loaded from ``drafter_dir`` (a causal LM with the
    target's vocabulary; None: a second copy of the target, the smallest assistant at hand)."""
    transformers = require("transformers")
    dtype, device = request.dtype, request.device
    assistant_dir = request.drafter_dir or request.target_dir
    try:
        target, note = held_hf_target(request.target_dir, dtype, device)
        assistant, _ = held_hf_target(assistant_dir, dtype, device, "assistant")
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    note += f"; assistant {Path(assistant_dir).name}"
    return _run(target, note, request, _config(transformers, request), assistant_model=assistant)


ASSISTANT_NOISE = 0.1  # relative weight noise of hf_assisted_perturbed's assistant


def hf_assisted_perturbed(request: EngineRequest) -> EngineResult:
    """Assisted generation whose assistant is a perturbed copy of the target (:data:`ASSISTANT_NOISE`,
    seed 0; ``drafter_dir`` unused): a draft model that disagrees with the target at some tokens, so that
    the loop rejects drafts and must roll its caches back (on GDN: the recurrent and conv states), which a
    copy of the target as its own assistant never asks of it. The note says where the assistant's own
    greedy tokens first leave the target's."""
    transformers = require("transformers")
    dtype, device = request.dtype, request.device
    try:
        target, note = held_hf_target(request.target_dir, dtype, device)
        assistant, a_note = held_hf_target(
            request.target_dir, dtype, device, "perturbed-assistant", noise=ASSISTANT_NOISE
        )
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    config = _config(transformers, request)
    res = _run(target, note + f"; assistant: the target, {perturbed(ASSISTANT_NOISE)}", request, config,
               assistant_model=assistant)  # fmt: skip
    if res.ok and request.temperature == 0:  # how far apart the two models are, each decoding alone
        own, ar = _run(assistant, a_note, request, config), _run(target, note, request, config)
        first = next((i for i, (a, b) in enumerate(zip(own.output_ids, ar.output_ids)) if a != b), None)
        where = "never" if first is None else f"at token {first}"
        res.notes += f"; the assistant's own greedy tokens leave the target's {where}"
    return res


def hf_assisted_dflash(request: EngineRequest) -> EngineResult:
    """transformers' DFlash speculation (``speculation_type="dflash"``) with the ``dflash`` package's
    ``DFlashDraftModel`` loaded from ``drafter_dir`` as the assistant."""
    transformers = require("transformers")
    zlab = require("dflash.model", "dflash")
    dtype, device, drafter_dir = request.dtype, request.device, request.drafter_dir
    try:
        target, note = held_hf_target(request.target_dir, dtype, device)
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    try:
        drafter = zlab.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch_dtype(dtype))
    except (ValueError, KeyError, OSError) as exc:
        return refused(f"dflash cannot load {Path(drafter_dir).name}: {describe(exc, 200)}", dtype, note)
    config = _config(transformers, request)
    config.speculation_type = "dflash"
    note += "; assistant dflash.DFlashDraftModel, speculation_type='dflash'"
    return _run(target, note, request, config, assistant_model=drafter.to(device).eval())
