"""``repro run EXPERIMENT --check``: resolve and validate an experiment without loading any weights.

Settings are type-checked (:func:`repro.harness.experiment.resolve`), every route spec is resolved
against the route registry (:func:`repro.decoding.routes.resolve_spec`), template placeholders still
unfilled are listed with the option that fills them, and each checkpoint path that is given is read
as far as its ``config.json`` (and, for EAGLE, its safetensors headers): a wrong format is refused in
the same one line a run would give, before any GPU time is spent (an embedded family member too: a
drafter member given as the target is refused). The GDN backend, each route's acceptance rule, the
``--shard`` and the suites' prompts are checked by the run's own functions. An external route
(:mod:`repro.engines.external_route`) is resolved as a run resolves it: a package its loop imports that
is not installed is refused here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from repro.decoding.routes import RANDOM, ROUTE_KINDS, family_of, resolve_spec, route_rule
from repro.drafters.dflash import read_dflash_config
from repro.drafters.eagle import EagleConfig, unsupported_format
from repro.drafters.weaver import read_weaver_config
from repro.engines.external_route import is_external, resolve_external, target_dir
from repro.errors import CheckpointError
from repro.gdn.backends import check_backend
from repro.harness.experiment import read_experiment, resolve
from repro.harness.overrides import PLACEHOLDER, apply_edits, unfilled
from repro.harness.parallel import experiment_prompts, parse_shard, shard_prompts
from repro.models.config import GDN
from repro.models.family import DEFAULT_TARGET, RANDOM_TARGET, members, resolve_checkpoint
from repro.models.loading import read_config, read_json_config, weight_names
from repro.models.target import resolve_dtype
from repro.reporting.report import switches_text


def _target(path: Path) -> str:
    cfg = read_config(path)
    gdn = sum(t == GDN for t in cfg.layer_types)
    return f"{cfg.source_format} target, {len(cfg.layer_types)} layers ({gdn} GDN), hidden {cfg.hidden_size}"


def _dflash(path: Path) -> str:
    read_dflash_config(path)
    return "z-lab DFlash drafter"


def _eagle(path: Path) -> str:
    raw = read_json_config(path, "EAGLE")
    if why := unsupported_format(raw, f"EAGLE checkpoint {path}", weight_names(path)):
        raise CheckpointError(why)
    EagleConfig.from_dict(raw, str(path / "config.json"))
    return "EAGLE drafter (EagleDraftModel)"


def _weaver(path: Path) -> str:
    read_weaver_config(path)
    return "Weaver adapter"


READERS: dict[str, Callable[[Path], str]] = {
    "target": _target,
    "dflash": _dflash,
    "eagle": _eagle,
    "weaver": _weaver,
}


@dataclass
class CheckReport:
    """A validated config, the checkpoints read (name -> format) and the placeholders left."""

    cfg: dict[str, Any]
    checkpoints: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        cfg = self.cfg
        lines = [
            f"experiment {cfg['name']}: settings and {len(cfg['routes'])} route(s) valid",
            f"  target {cfg['target']}, {cfg['dtype']} on {cfg['device']} ({cfg['gdn_backend']}), suites "
            f"{','.join(cfg['suites'])}, limit {cfg['limit']}, max_new_tokens {cfg['max_new_tokens']}",
        ]
        if cfg.get("switches"):
            lines.append(f"  engine switches: {switches_text(cfg['switches'])}")
        for route in cfg["routes"]:
            params = ", ".join(
                f"{k}={v}" for k, v in route.items() if k not in ("name", "kind") and v is not None
            )
            lines.append(f"  route {route['name']} ({route['kind']}){': ' + params if params else ''}")
        lines += [f"  checkpoint {name}: {what}" for name, what in self.checkpoints.items()]
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  to give at run time: {m}" for m in self.missing]
        return "\n".join(lines)


def _read(name: str, spec: str, reader: str) -> str:
    if spec == PLACEHOLDER:
        return ""
    return f"{READERS[reader](resolve_checkpoint(spec, name))} ({spec})"


def check_experiment(
    experiment: str,
    overrides: dict[str, Any] | None = None,
    edits: dict[str, Any] | None = None,
    shard: str | None = None,
) -> CheckReport:
    """The validated experiment (and ``--shard`` ``shard``), or the one-line ReproError the run would
    give; a device that is absent here (CUDA) is checked as cpu and said so."""
    overrides = dict(overrides or {})
    notes = []
    no_cuda = overrides.get("device") is None and not torch.cuda.is_available()
    if no_cuda:
        overrides["device"] = "cpu"
        notes.append("no CUDA here: device checked as cpu")
    raw = read_experiment(experiment)
    raw = apply_edits(raw, **edits) if edits else raw
    cfg = resolve(raw, overrides)
    parsed = parse_shard(shard) if shard is not None else None
    # the backend on the device the run would have: the experiment's (auto: CUDA) where cpu stands in
    run_device = "cuda" if no_cuda and raw.get("device") != "cpu" else cfg["device"]
    check_backend(cfg["gdn_backend"], torch.device(run_device), dtype=resolve_dtype(cfg["dtype"]))
    family = family_of(cfg["target"])
    external = {}  # route name -> the drafter kind its loop takes
    routes = []
    for spec in cfg["routes"]:
        if is_external(spec):
            name, params, engine = resolve_external(spec, str(cfg["target"]))
            if cfg["target"] != PLACEHOLDER:
                target_dir(str(cfg["target"]), f"route {name!r} (external {engine.name})")
            external[name] = engine.drafter
            routes.append({"name": name, **params})
        else:
            routes.append(resolve_spec(spec, family))
    cfg["routes"] = routes
    report = CheckReport(cfg, missing=unfilled(cfg), notes=notes)
    target = str(cfg["target"])
    if target not in (PLACEHOLDER, RANDOM_TARGET):  # as open_target opens it (tiny-random is built)
        report.checkpoints["target"] = _read(
            "target", DEFAULT_TARGET if target == "default" else target, "target"
        )
    for route in cfg["routes"]:
        drafter = route.get("drafter")
        if route["name"] in external and external[route["name"]] and drafter not in (None, PLACEHOLDER):
            name = f"{route['name']}.drafter"
            if str(drafter) in members():
                report.checkpoints[name] = "embedded family member"
            else:  # its format is the loop's business (an SGLang EAGLE drafter is not repro's): it exists
                resolve_checkpoint(str(drafter), name)
                report.checkpoints[name] = (
                    f"{external[route['name']]} drafter directory, read by the loop ({drafter})"
                )
            continue
        for param in ROUTE_KINDS[route["kind"]].params:
            value = route.get(param.name)
            if param.checkpoint and value not in (None, RANDOM, PLACEHOLDER):
                name = f"{route['name']}.{param.name}"
                report.checkpoints[name] = _read(name, str(value), param.checkpoint)
        if route["name"] not in external:  # the rule of each route the run builds
            rule = route["acceptance"] or cfg["acceptance"]
            route_rule(route["name"], rule, cfg["temperature"], cfg["seed"])
    prompts = experiment_prompts(cfg)  # the suites as the run loads them: checksums and records
    if parsed is not None:
        mine = shard_prompts(prompts, parsed)
        report.notes.append(f"shard {parsed}: {len(mine)} of {len(prompts)} prompt(s)")
    return report
