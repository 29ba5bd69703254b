"""repro's own ``dflash_chain`` route through the engine interface: the control row of the check
(same drafter checkpoint, same prompts, repro's exact commit of the accepted prefix)."""

from __future__ import annotations

import time

import torch

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.engines.result import OK, EngineRequest, EngineResult
from repro.models.target import open_target


def repro_dflash_chain(request: EngineRequest) -> EngineResult:
    """Decode with repro's ``dflash_chain`` route (greedy acceptance at temperature 0)."""
    dtype, temperature, seed = request.dtype, request.temperature, request.seed
    model, _ = open_target(str(request.target_dir), dtype, request.device)
    rule = "greedy" if temperature == 0 else "sample_match"
    spec = {"kind": "dflash_chain", "drafter": str(request.drafter_dir)}
    route = build_route(spec, model.config.vocab_size, rule, temperature, seed, target=model)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    res = generate(model, list(request.prompt_ids), route, request.max_new_tokens, request.stop_ids or ())
    wall = time.perf_counter() - t0
    note = f"repro HybridLM, {dtype} throughout"
    return EngineResult(res.output_ids, list(res.accepted_lengths), wall, OK, dtype, note)
