"""Which implementations are exact: each external loop x target x prompt against repro's AR tokens.

``run_external_check`` decodes a few suite prompts (first turns, stop tokens ignored so every
output has ``max_new_tokens``) with repro's plain AR route (the reference) and with each engine,
and writes ``manifest.json``, ``records.jsonl`` (one line per engine x target x prompt),
``table.csv`` and ``report.md`` into ``out_dir``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from repro.data.suites import load_suite
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.engines.catalog import Engine, pick
from repro.engines.hf_target import torch_dtype
from repro.engines.result import (
    REFUSED,
    SAMPLED,
    EngineRequest,
    EngineResult,
    MissingPackageError,
    prompt_seed,
)
from repro.engines.tables import KIND
from repro.errors import ConfigError
from repro.models.family import resolve_checkpoint
from repro.models.target import open_target
from repro.reporting.records import (
    build_manifest,
    compare_to_reference,
    divergence_index,
    sha256_ids,
)
from repro.reporting.rundir import RunDir

NOT_RUN = "not run: "
HF_AR = "transformers-generate"  # its tokens separate a loop's own error from transformers' rounding


def verdict(result: EngineResult, reference: list[int], temperature: float = 0.0) -> str:
    """``"identical"``, ``"diverged at token k"`` (first differing new token), the refusal, or at
    ``temperature`` > 0 :data:`SAMPLED`: a sampling loop draws other tokens than a correct one would
    with other random numbers, so its exactness cannot be judged token by token."""
    if not result.ok:
        return result.status
    if temperature > 0:
        return SAMPLED
    return compare_to_reference(result.output_ids, reference)


@dataclass
class ExternalRecord:
    """One engine x target x prompt (one line of records.jsonl)."""

    engine: str
    target: str
    suite: str
    prompt_id: str
    prompt_sha256: str
    prompt_tokens: int
    max_new_tokens: int
    status: str
    vs_ar: str
    first_divergence: int | None
    vs_transformers_ar: str | None
    output_ids: list[int]
    output_sha256: str
    reference_sha256: str
    accepted_lengths: list[int] | None
    wall_s: float
    dtype: str
    notes: str
    verify_steps: int | None = None  # engines that expose counters only (SGLang, vLLM)
    mal: float | None = None  # the engine's own mean accepted length from those counters


def _external_versions() -> dict[str, str]:
    out = {}
    for name in ("transformers", "dflash", "flash-linear-attention", "torch", "sglang", "vllm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _run_engine(engine: Engine, target: str, ids: list[int], n: int, seed: int, dtype: str, device: str,
                temperature: float = 0.0) -> EngineResult:  # fmt: skip
    drafter = engine.drafter_dir(target, lambda name: resolve_checkpoint(name, "drafter"))
    try:
        target_dir = resolve_checkpoint(target, "target")
        seed = prompt_seed(seed, ids)
        request = EngineRequest(target_dir, drafter, ids, n, temperature=temperature, seed=seed,
                                stop_ids=None, dtype=dtype, device=device)  # fmt: skip
        return engine.fn(request)
    except MissingPackageError as exc:
        return EngineResult([], None, 0.0, NOT_RUN + str(exc), dtype)


def run_external_check(
    out_dir: str | Path,
    targets: Sequence[str] = ("tiny-qwen35", "tiny-gdn"),
    suites: Sequence[str] = ("gsm8k", "mt_bench"),
    limit: int = 2,
    max_new_tokens: int = 48,
    engines: Sequence[str] | None = None,
    seed: int = 42,
    dtype: str = "float64",
    device: str = "cpu",
    cpu_threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
    temperature: float = 0.0,
) -> list[ExternalRecord]:
    """Check of every engine on every target and prompt, written as a ``falsify-external`` run
    directory (records as they are made, then table.csv and report.md); returns the records. Greedy
    by default; at ``temperature`` > 0 every loop samples and its verdict is :data:`SAMPLED`."""
    chosen = pick(list(engines) if engines is not None else None)
    for option, names in (("--targets", targets), ("--suites", suites)):
        if not names:
            raise ConfigError(f"{option} must name at least one value")
    for target in targets:  # a bad target or dtype before the run directory is made
        resolve_checkpoint(target, "target")
    if any(e.package is None and "transformers" in e.needs for e in chosen):
        torch_dtype(dtype)  # the transformers loops' dtypes
    if cpu_threads:
        torch.set_num_threads(int(cpu_threads))
    prompts = [p for s in suites for p in load_suite(s, limit=limit, seed=seed)]
    config: dict[str, Any] = {
        "check": "external",
        "targets": list(targets),
        "suites": list(suites),
        "limit": limit,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "temperature": float(temperature),
        "stop_tokens": "ignored",
        "dtype": dtype,
        "device": device,
        "engines": [e.name for e in chosen],
        "reference": "repro ar route",
    }
    manifest = {**build_manifest(config, seed), "external_versions": _external_versions()}
    records: list[ExternalRecord] = []
    with RunDir(out_dir, manifest, kind=KIND) as run:  # refuses an existing run before decoding
        for target in targets:
            model, tok = open_target(target, dtype, device)
            ar = build_route({"kind": "ar"}, model.config.vocab_size, "greedy", 0.0, seed)
            for prompt in prompts:
                ids = tok.chat_prompt([{"role": "user", "content": prompt.turns[0]}])
                ref = generate(model, ids, ar, max_new_tokens).output_ids
                hf_ar: list[int] | None = None
                for engine in chosen:
                    if progress:
                        progress(f"{target} {prompt.suite}/{prompt.id} {engine.name}")
                    res = _run_engine(engine, target, ids, max_new_tokens, seed, dtype, device, temperature)
                    vs_ar = verdict(res, ref, temperature)
                    if engine.name == HF_AR and res.ok:
                        hf_ar = res.output_ids
                    both = res.ok and hf_ar is not None
                    vs_hf = verdict(res, hf_ar, temperature) if both else None
                    record = ExternalRecord(
                        engine.name, target, prompt.suite, prompt.id, sha256_ids(ids), len(ids),
                        max_new_tokens, res.status, vs_ar, divergence_index(vs_ar), vs_hf, res.output_ids,
                        sha256_ids(res.output_ids), sha256_ids(ref), res.accepted_lengths,
                        round(res.wall_s, 4), res.dtype, res.notes, res.verify_steps, res.mal,
                    )  # fmt: skip
                    run.append(asdict(record))
                    records.append(record)
        run.write_report()
    return records


__all__ = ["NOT_RUN", "REFUSED", "SAMPLED", "ExternalRecord", "run_external_check", "verdict"]
