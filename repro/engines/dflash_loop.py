"""z-lab's DFlash reference loop: ``dflash.model.dflash_generate`` on a transformers target.

The loop drafts a block with the ``dflash`` package's ``DFlashDraftModel``, verifies it with one
target forward and drops the rejected tokens with the cache's ``crop``. ``return_stats=True``
(accepted lengths) times with ``torch.cuda.synchronize``; on CPU that timer is swapped for
``time.perf_counter`` for the call, so the accepted lengths come back there too.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from repro.engines.hf_target import TargetRefused, held_hf_target, torch_dtype
from repro.engines.result import OK, EngineRequest, EngineResult, refused, require
from repro.errors import describe


@contextmanager
def _host_timer(zlab: Any, device: str):
    """``dflash.model._cuda_time`` without the CUDA synchronize when decoding on CPU."""
    if device != "cpu":
        yield
        return
    saved = zlab._cuda_time
    zlab._cuda_time = time.perf_counter
    try:
        yield
    finally:
        zlab._cuda_time = saved


def dflash_generate(request: EngineRequest) -> EngineResult:
    """Decode with ``dflash.model.dflash_generate`` (greedy at temperature 0, else its rejection
    sampling, seeded with ``seed``); stops on ``stop_ids`` unless None."""
    zlab = require("dflash.model", "dflash")
    dtype, device = request.dtype, request.device
    try:
        target, note = held_hf_target(request.target_dir, dtype, device)
    except TargetRefused as exc:
        return refused(str(exc), dtype)
    drafter_dir = request.drafter_dir
    try:
        drafter = zlab.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch_dtype(dtype))
    except (ValueError, KeyError, OSError) as exc:
        return refused(f"dflash cannot load {Path(drafter_dir).name}: {describe(exc, 200)}", dtype, note)
    drafter = drafter.to(device).eval()
    ids = torch.tensor([list(request.prompt_ids)], dtype=torch.long, device=device)
    torch.manual_seed(request.seed)
    t0 = time.perf_counter()
    try:
        with _host_timer(zlab, device):
            out = zlab.dflash_generate(
                drafter, target, ids, request.max_new_tokens, request.stop_ids,
                temperature=request.temperature, return_stats=True,
            )  # fmt: skip
    except Exception as exc:  # the loop failing on this model is a finding, recorded with its reason
        return refused(f"dflash_generate failed: {describe(exc, 200)}", dtype, note)
    wall = time.perf_counter() - t0
    new = out.output_ids[0, len(request.prompt_ids) :].tolist()
    lengths = [int(a) for a in out.acceptance_lengths]
    return EngineResult(new, lengths, wall, OK, dtype, note, prefill_s=float(out.time_to_first_token))
