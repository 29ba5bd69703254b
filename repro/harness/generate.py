"""`repro generate`: one prompt, one route, JSON out."""

from __future__ import annotations

import re
from typing import Any

from repro.decoding.engine import generate
from repro.decoding.routes import COMMON_PARAMS, build_route, family_of, prepare_graphs, route_kind
from repro.errors import ConfigError
from repro.models.graphed import GraphedTarget, resolve_engine
from repro.models.hybrid import HybridLM
from repro.models.target import open_target


def parse_params(
    kind: str, items: list[str], checkpoints: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """``--param KEY=VALUE`` items converted by the declared type of ``kind``'s parameter KEY, plus
    the checkpoint options (``--drafter``, ``--weaver``: param name -> value, None = not given)."""
    rk = route_kind(kind)
    declared = {p.name: p for p in rk.params + COMMON_PARAMS if p.name != "name"}
    takes = ", ".join(p.name for p in rk.params) or "no parameters"
    given = [item.partition("=") for item in items]
    given += [(k, "=", v) for k, v in (checkpoints or {}).items() if v is not None]
    params: dict[str, Any] = {}
    for key, sep, value in given:
        if not sep or not key:
            raise ConfigError(f"route parameter {key + sep + value!r} must look like KEY=VALUE")
        if key not in declared:
            raise ConfigError(f"route kind {kind}: unknown parameter {key}; {kind} takes {takes}")
        if key in params:
            raise ConfigError(f"route parameter {key} given twice")
        params[key] = declared[key].parse(value)
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
    ignore_eos: bool, checkpoints: dict[str, str | None] | None = None, backend: str = "reference",
    engine: str = "auto",
) -> dict[str, Any]:  # fmt: skip
    """Decode one prompt; routes with a drafter first run AR to get the reference continuation. With
    ``prompt_ids`` a checkpoint without tokenizer files decodes too ("text" is then None).

    ``checkpoints`` are the ``--drafter``/``--weaver`` options (param name -> value or None); on a
    family target an omitted drafter is the target's own. ``engine``: auto (graphed on CUDA), eager
    (HybridLM) or graphed (the static decoder; CUDA graphs on CUDA).
    """
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    spec = {"kind": route, **parse_params(route, params, checkpoints)}
    resolve_engine(engine, "cpu")  # a bad name fails before the target is opened
    model, tokenizer = open_target(target, dtype, device, need_tokenizer=prompt_ids is None)
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
    decoder: HybridLM | GraphedTarget = model
    if resolve_engine(engine, model.device) == "graphed":
        decoder = GraphedTarget(model)  # routes built on it take their drafters' static paths
    chosen = build_route(
        spec, vocab, acceptance, temperature, seed, target=decoder, commit=commit, family=family_of(target)
    )
    if ignore_eos:
        stops: tuple[int, ...] = ()
    else:
        stops = tuple(tokenizer.stop_token_ids) if tokenizer else tuple(model.config.eos_token_id)
    if isinstance(decoder, GraphedTarget):
        prepare_graphs(decoder, [chosen])
    reference = None
    if chosen.drafter is not None:
        ar = build_route({"kind": "ar"}, vocab, acceptance, temperature, seed, commit=commit)
        reference = generate(decoder, ids, ar, max_new_tokens, stops).output_ids
    result = generate(decoder, ids, chosen, max_new_tokens, stops, reference)
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
        "device_stage_s": result.device_stage_s,
        "busy_stage_s": result.busy_stage_s,
        "graph_captures": result.graph_captures,
        "host_wait_s": result.host_wait_s,
        "identical_to_ar": None if reference is None else result.output_ids == reference,
        "engine": "graphed" if isinstance(decoder, GraphedTarget) else "eager",
    }
