"""SGLang's offline engine on the same checkpoint and prompt ids: plain AR, and its speculative
algorithms with a drafter directory (DFLASH for z-lab DFlash drafters, EAGLE for EAGLE ones).

Untested against a live engine until the first nightly run (no wheel fits this CI, no GPU). What it
relies on is documented by SGLang (docs.sglang.io, read 2026-12; SGLang 0.5.x):

- ``sglang.Engine(model_path=..., dtype=..., random_seed=..., speculative_algorithm=...,
  speculative_draft_model_path=..., speculative_num_steps=..., speculative_eagle_topk=...,
  speculative_num_draft_tokens=...)`` ("Offline Engine API"; "Speculative Decoding": EAGLE, EAGLE3,
  DFLASH, ...), ``Engine.shutdown()``;
- ``Engine.generate(input_ids=[...], sampling_params={"temperature": 0, "max_new_tokens": N,
  "ignore_eos": True | "stop_token_ids": [...]})`` ("Sampling Parameters": ``input_ids``,
  ``max_new_tokens``, ``ignore_eos``, ``stop_token_ids``);
- the response dict: ``output_ids`` (the new token ids) and ``meta_info`` with
  ``completion_tokens`` and, under speculative decoding, ``spec_verify_ct`` (accept length =
  completion_tokens / spec_verify_ct, the engine's own MAL: it counts prefill's first token too).

The fixture ``tests/engines/fixtures/sglang_response.json`` holds such a response.
"""

from __future__ import annotations

import time
from typing import Any

from repro.engines.result import OK, EngineRequest, EngineResult, refused, require
from repro.engines.serving import cached_engine, dtype_refusal
from repro.errors import describe

# per drafter kind: the algorithm and its documented tuning knobs (a chain of 5 drafts for EAGLE)
ALGORITHMS: dict[str, dict[str, Any]] = {
    "dflash": {"speculative_algorithm": "DFLASH"},
    "eagle": {
        "speculative_algorithm": "EAGLE", "speculative_num_steps": 5, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 6,
    },
}  # fmt: skip


def engine_kwargs(request: EngineRequest, drafter: str | None) -> dict[str, Any]:
    """The ``sglang.Engine`` arguments for a target, and a drafter of kind ``drafter`` (None: AR)."""
    kwargs: dict[str, Any] = {"model_path": str(request.target_dir), "dtype": request.dtype,
                              "random_seed": request.seed}  # fmt: skip
    if drafter is not None:
        kwargs.update(ALGORITHMS[drafter], speculative_draft_model_path=str(request.drafter_dir))
    return kwargs


def sampling_params(request: EngineRequest) -> dict[str, Any]:
    """Greedy at temperature 0; exactly ``max_new_tokens`` when ``stop_ids`` is None."""
    params: dict[str, Any] = {
        "temperature": float(request.temperature), "max_new_tokens": int(request.max_new_tokens)
    }  # fmt: skip
    if request.stop_ids is None:
        params["ignore_eos"] = True
    else:
        params["stop_token_ids"] = list(request.stop_ids)
    return params


def translate(response: dict[str, Any], wall_s: float, dtype: str, note: str = "") -> EngineResult:
    """An ``EngineResult`` from one ``Engine.generate`` response (a refusal naming a missing field)."""
    meta = response.get("meta_info") or {}
    if "output_ids" not in response:
        return refused(
            "SGLang's response has no output_ids (fields: " + ", ".join(sorted(response)) + ")", dtype
        )
    ids = [int(t) for t in response["output_ids"]]
    completion = int(meta.get("completion_tokens", len(ids)))
    steps = meta.get("spec_verify_ct")
    mal = completion / int(steps) if steps else None
    return EngineResult(ids, None, wall_s, OK, dtype, note, int(steps) if steps else None, mal)


def sglang_generate(request: EngineRequest, *, drafter: str | None = None) -> EngineResult:
    """One prompt through ``sglang.Engine`` (AR, or speculative with a drafter of kind ``drafter``).
    Runs ``request.dtype`` (bfloat16, float16 or float32; refused otherwise); ``device`` is unused."""
    sglang = require("sglang")
    dtype = request.dtype
    if why := dtype_refusal("SGLang", dtype):
        return refused(why, dtype)
    kwargs = engine_kwargs(request, drafter)
    note = f"sglang {getattr(sglang, '__version__', '?')}" + (
        f", {kwargs['speculative_algorithm']}" if drafter else ""
    )
    try:
        engine = cached_engine("sglang", tuple(sorted(kwargs.items())), lambda: sglang.Engine(**kwargs),
                               lambda e: e.shutdown())  # fmt: skip
        t0 = time.perf_counter()
        response = engine.generate(
            input_ids=list(request.prompt_ids), sampling_params=sampling_params(request)
        )
    except Exception as exc:  # the engine refusing this model is a finding, recorded with its reason
        return refused(f"sglang failed: {describe(exc, 300)}", dtype, note)
    return translate(response, time.perf_counter() - t0, dtype, note)
