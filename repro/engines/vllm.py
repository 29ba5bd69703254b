"""vLLM's offline ``LLM`` on the same checkpoint and prompt ids: plain AR, and its
``speculative_config`` with a drafter directory (method ``dflash`` or ``eagle``).

Untested against a live engine until the first nightly run (no CUDA wheel fits this CI). What it
relies on is documented by vLLM (docs.vllm.ai, read 2026-12; v0.32.0 pages unless noted):

- ``LLM(model=..., dtype=..., seed=..., speculative_config={"method": ..., "model": ...,
  "num_speculative_tokens": ...}, disable_log_stats=False)`` ("Speculative Decoding"; the DFlash
  method with ``num_speculative_tokens`` as in the vLLM / speculators DFlash pages);
- ``LLM.generate([{"prompt_token_ids": [...]}], SamplingParams(temperature=0, max_tokens=N,
  ignore_eos=True | stop_token_ids=[...]))`` returning ``RequestOutput`` objects whose
  ``outputs[0].token_ids`` are the new tokens;
- ``LLM.get_metrics()``: the engine's counters, among them ``vllm:spec_decode_num_drafts`` and
  ``vllm:spec_decode_num_accepted_tokens`` ("Production Metrics"; global counters, so one prompt's
  are the difference around its ``generate``; MAL = 1 + accepted / drafts). Per-request
  ``metrics.speculative_decoding`` exists only in the server's responses (v0.32.0 "Per-Request
  Acceptance Metrics"), not used here.

The fixture ``tests/engines/fixtures/vllm_response.json`` holds such an output and counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from repro.engines.result import OK, EngineRequest, EngineResult, refused, require
from repro.engines.serving import cached_engine, dtype_refusal
from repro.errors import describe

DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
METHODS: dict[str, dict[str, Any]] = {
    "dflash": {"method": "dflash", "num_speculative_tokens": 15},
    "eagle": {"method": "eagle", "num_speculative_tokens": 5},
}


def llm_kwargs(request: EngineRequest, drafter: str | None) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for a target, and a drafter of kind ``drafter`` (None: AR)."""
    kwargs: dict[str, Any] = {
        "model": str(request.target_dir),
        "dtype": request.dtype,
        "seed": request.seed,
        "disable_log_stats": False,
    }
    if drafter is not None:
        kwargs["speculative_config"] = {**METHODS[drafter], "model": str(request.drafter_dir)}
    return kwargs


def counters(metrics: Iterable[Any]) -> dict[str, float]:
    """``LLM.get_metrics()`` counters by name (metrics with a ``name`` and a numeric ``value``)."""
    out: dict[str, float] = {}
    for m in metrics:
        value = getattr(m, "value", None)
        if isinstance(value, int | float):
            out[m.name] = out.get(m.name, 0.0) + float(value)
    return out


def translate(output: Any, before: dict[str, float], after: dict[str, float], wall_s: float, dtype: str,
              note: str = "") -> EngineResult:  # fmt: skip
    """An ``EngineResult`` from one ``RequestOutput`` and the counters around its ``generate``."""
    ids = [int(t) for t in output.outputs[0].token_ids]
    drafts = after.get(DRAFTS, 0.0) - before.get(DRAFTS, 0.0)
    if drafts <= 0:
        return EngineResult(ids, None, wall_s, OK, dtype, note)
    accepted = after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)
    return EngineResult(ids, None, wall_s, OK, dtype, note, int(drafts), 1.0 + accepted / drafts)


def vllm_generate(request: EngineRequest, *, drafter: str | None = None) -> EngineResult:
    """One prompt through ``vllm.LLM`` (AR, or speculative with a drafter of kind ``drafter``).
    Runs ``request.dtype`` (bfloat16, float16 or float32; refused otherwise); ``device`` is unused."""
    vllm = require("vllm")
    dtype, stop_ids = request.dtype, request.stop_ids
    if why := dtype_refusal("vLLM", dtype):
        return refused(why, dtype)
    kwargs = llm_kwargs(request, drafter)
    note = f"vllm {getattr(vllm, '__version__', '?')}" + (
        f", {METHODS[drafter]['method']}" if drafter else ""
    )
    stops: dict[str, Any] = {"ignore_eos": True} if stop_ids is None else {"stop_token_ids": list(stop_ids)}
    params = vllm.SamplingParams(
        temperature=float(request.temperature), max_tokens=int(request.max_new_tokens), seed=request.seed,
        **stops,
    )  # fmt: skip
    try:
        llm = cached_engine("vllm", repr(sorted(kwargs.items())), lambda: vllm.LLM(**kwargs), lambda _: None)
        before = counters(llm.get_metrics())
        t0 = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": list(request.prompt_ids)}], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = counters(llm.get_metrics())
    except Exception as exc:  # the engine refusing this model is a finding, recorded with its reason
        return refused(f"vllm failed: {describe(exc, 300)}", dtype, note)
    return translate(outputs[0], before, after, wall, dtype, note)
