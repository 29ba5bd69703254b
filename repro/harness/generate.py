"""`repro generate`: one prompt, one route, JSON out."""

from __future__ import annotations

import re
from typing import Any

from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.errors import ConfigError
from repro.models.target import open_target


def parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"route parameter {item!r} must look like KEY=VALUE")
        try:
            params[key] = int(value)
        except ValueError:
            try:
                params[key] = float(value)
            except ValueError:
                params[key] = value
    return params


IDS_PATTERN = re.compile(r"[0-9]+(?:(?:\s*,\s*|\s+)[0-9]+)*")


def parse_ids(text: str, vocab_size: int) -> list[int]:
    """Plain decimal token ids separated by commas and/or whitespace ("1,2,3", "1 2 3", "1, 2")."""
    stripped = text.strip()
    if not stripped.isascii() or not IDS_PATTERN.fullmatch(stripped):
        raise ConfigError(
            f"--prompt-ids must be plain decimal integers separated by commas or spaces, got {text!r}"
        )
    ids = [int(x) for x in re.split(r"[\s,]+", stripped)]
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ConfigError(f"--prompt-ids needs ids in [0, {vocab_size}); got {bad}")
    return ids


def generate_one(
    prompt: str | None, prompt_ids: str | None, route: str, params: list[str], target: str, raw: bool,
    max_new_tokens: int, temperature: float, seed: int, dtype: str, device: str, commit: str,
    ignore_eos: bool, backend: str = "reference",
) -> dict[str, Any]:  # fmt: skip
    """Decode one prompt; synthetic routes first run AR to get their reference continuation. With
    ``prompt_ids`` a checkpoint without tokenizer files decodes too ("text" is then None)."""
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    model, tokenizer = open_target(target, dtype, device, commit, need_tokenizer=prompt_ids is None)
    model.set_gdn_backend(backend)
    vocab = model.config.vocab_size
    if prompt_ids is not None:
        ids = parse_ids(prompt_ids, vocab)
    else:
        ids = (
            tokenizer.encode(prompt or "")
            if raw
            else tokenizer.chat_prompt([{"role": "user", "content": prompt}])
        )
    acceptance = "sample_match" if temperature > 0 else "greedy"
    spec = {"name": route, "kind": route, **parse_params(params)}
    chosen = build_route(spec, vocab, acceptance, temperature, seed, target=model)
    if ignore_eos:
        stops: tuple[int, ...] = ()
    else:
        stops = tuple(tokenizer.stop_token_ids) if tokenizer else tuple(model.config.eos_token_id)
    reference = None
    if chosen.drafter is not None:
        ar = build_route({"name": "ar", "kind": "ar"}, vocab, acceptance, temperature, seed)
        reference = generate(model, ids, ar, max_new_tokens, stops).output_ids
    result = generate(model, ids, chosen, max_new_tokens, stops, reference)
    return {
        "route": route,
        "params": chosen.params,
        "prompt_ids": ids,
        "output_ids": result.output_ids,
        "text": tokenizer.decode(result.output_ids) if tokenizer else None,
        "new_tokens": len(result.output_ids),
        "steps": result.steps,
        "accepted_lengths": result.accepted_lengths,
        "mal": sum(result.accepted_lengths) / result.steps if result.steps else None,
        "finish_reason": result.finish_reason,
        "prefill_s": result.prefill_s,
        "decode_s": result.decode_s,
        "stage_s": result.stage_s,
        "identical_to_ar": None if reference is None else result.output_ids == reference,
    }
