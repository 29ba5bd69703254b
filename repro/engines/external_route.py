"""External routes: an experiment route of kind ``external`` runs another implementation's decode loop
(an engine of :mod:`repro.engines.catalog`) on the run's target checkpoint and prompts, beside repro's
own routes, and writes an ordinary decode record.

The record holds the loop's tokens and their hash, the verdict against the run's AR tokens
(:func:`repro.engines.verdicts.verdict`: identical, diverged at token k, ``refused: <reason>``, or
``sampled: ...`` at temperature > 0), the loop's own accepted lengths where it reports them (else
none: ``steps`` 0), and its wall time as ``decode_s`` (less the prefill time the loop reports, as
``prefill_s``). Stage times are not measured inside another loop (0). The harness builds these
routes (:func:`build_external`); ``repro.decoding.routes.build_route`` refuses the kind, since the
decoding package does not import the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.data.suites import Prompt
from repro.decoding.routes import EXTERNAL, family_of, resolve_spec
from repro.engines.catalog import ENGINES, Engine
from repro.engines.result import EngineRequest, EngineResult, prompt_seed
from repro.engines.verdicts import verdict
from repro.errors import ConfigError
from repro.models.family import DEFAULT_TARGET, drafter_name, members, resolve_checkpoint
from repro.reporting.records import STAGES, DecodeRecord, sha256_ids

BUILT_IN_TARGETS = ("tiny-random",)  # built in code: no checkpoint directory for another loop to load


def is_external(spec: dict[str, Any]) -> bool:
    """Whether a route spec (or a record's ``route_params``) is of the external kind."""
    return spec.get("kind") == EXTERNAL


def resolve_external(spec: dict[str, Any], target: str) -> tuple[str, dict[str, Any], Engine]:
    """(name, resolved parameters, engine) of an external route spec on ``target`` (the experiment's
    ``target`` setting): the drafter defaults to the family target's own of the engine's kind. One-line
    ConfigError when the spec is invalid or a package the engine imports is not installed."""
    params = resolve_spec(spec, family_of(target))
    name = params.pop("name")
    engine = ENGINES[params["engine"]]
    where = f"route {name!r} ({EXTERNAL} {engine.name})"
    given = [k for k in ("commit", "acceptance") if params[k] is not None]
    if given:
        raise ConfigError(f"{where}: {' and '.join(given)} are the loop's own; remove them from the route")
    if package := engine.missing():
        raise ConfigError(f"{where}: package {package} is not installed (pip install {package})")
    if engine.drafter is None and params["drafter"] is not None:
        raise ConfigError(f"{where}: this loop takes no drafter, got drafter {params['drafter']!r}")
    if engine.drafter is not None and params["drafter"] is None:
        family = family_of(target)
        default = drafter_name(family, engine.drafter) if family else None
        if default not in members():
            raise ConfigError(f"{where}: missing parameter drafter (a {engine.drafter} drafter checkpoint)")
        params["drafter"] = default
    return name, params, engine


def target_dir(target: str, where: str) -> Path:
    """The checkpoint directory an external loop loads for the experiment's ``target``."""
    if target in BUILT_IN_TARGETS:
        raise ConfigError(
            f"{where}: target {target} is built in code and an external loop loads a checkpoint directory"
            " (`repro export-default DIR` writes one)"
        )
    return resolve_checkpoint(DEFAULT_TARGET if target == "default" else target, "target")


@dataclass(frozen=True)
class ExternalRoute:
    """An external route of one experiment: its name and resolved parameters (``params``, as records
    carry them), the engine, and the checkpoint directories it loads."""

    name: str
    params: dict[str, Any]
    engine: Engine
    target_dir: Path
    drafter_dir: Path | None

    def decode(self, prompt_ids: list[int], cfg: dict[str, Any], stop_ids: tuple[int, ...]) -> EngineResult:
        """One generation by the loop with the experiment's settings (no stop token when ``stop_ids``
        is empty: exactly ``max_new_tokens``), seeded per prompt (:func:`prompt_seed`)."""
        seed = prompt_seed(int(cfg["seed"]), prompt_ids)
        request = EngineRequest(
            self.target_dir, self.drafter_dir, list(prompt_ids), int(cfg["max_new_tokens"]),
            temperature=float(cfg["temperature"]), seed=seed, stop_ids=list(stop_ids) or None,
            dtype=str(cfg["dtype"]), device=str(cfg["device"]),
        )  # fmt: skip
        return self.engine.fn(request)

    def record(
        self,
        prompt: Prompt,
        turn: int,
        prompt_ids: list[int],
        result: EngineResult,
        reference: list[int] | None,
        cfg: dict[str, Any],
        stop_ids: tuple[int, ...],
    ) -> DecodeRecord:
        """The decode record of ``result``, judged against the run's AR tokens ``reference``."""
        temperature = float(cfg["temperature"])
        vs_ar = (
            "no reference"
            if reference is None and result.ok
            else verdict(result, reference or [], temperature)
        )
        ids = list(result.output_ids)
        lengths = list(result.accepted_lengths or [])
        if sum(lengths) != max(len(ids) - 1, 0) or any(a < 1 for a in lengths):
            lengths = []  # counts that do not add up to the tokens are not per-step accepted lengths
        prefill = float(result.prefill_s or 0.0)
        return DecodeRecord(
            route=self.name, route_params=self.params, suite=prompt.suite, prompt_id=prompt.id, turn=turn,
            prompt_sha256=sha256_ids(prompt_ids), prompt_tokens=len(prompt_ids), new_tokens=len(ids),
            steps=len(lengths), accepted_lengths=lengths, tree_sizes=[],
            prefill_s=prefill, decode_s=max(float(result.wall_s) - prefill, 0.0),
            stage_s=dict.fromkeys(STAGES, 0.0), output_ids=ids, output_sha256=sha256_ids(ids),
            finish_reason="stop" if ids and ids[-1] in stop_ids else "length",
            vs_ar=vs_ar, temperature=temperature, seed=int(cfg["seed"]),
        )  # fmt: skip

    def notes(self, result: EngineResult) -> dict[str, Any]:
        """What the manifest keeps of how the loop ran (records hold no free text)."""
        return {
            "engine": self.engine.name,
            "what": self.engine.what,
            "dtype": result.dtype,
            "notes": result.notes,
        }


def build_external(spec: dict[str, Any], target: str) -> ExternalRoute:
    """The external route of ``spec`` on the experiment's ``target``; one-line ConfigError (exit 2) when
    it cannot run here (bad spec, missing package, no checkpoint directory)."""
    name, params, engine = resolve_external(spec, target)
    where = f"route {name!r} ({EXTERNAL} {engine.name})"
    drafter = params["drafter"]
    drafter_dir = resolve_checkpoint(drafter, f"{name}.drafter") if drafter else None
    params = {k: v for k, v in params.items() if k not in ("commit", "acceptance")}  # the loop's own
    return ExternalRoute(name, params, engine, target_dir(target, where), drafter_dir)
