"""Command-line edits of an experiment before it is resolved: ``--set key=value``, ``--drafter
[ROUTE=]PATH``, ``--weaver PATH``, and the checkpoint placeholders of templates.

A template (``repro/experiments/templates/*.yaml``) writes :data:`PLACEHOLDER` where a checkpoint
path belongs (``target``, a route's ``drafter`` or ``weaver``); ``repro run TEMPLATE --target DIR
--drafter DIR --weaver DIR`` fills them in, and a run with one left unfilled is refused in one line
that names the option to give. Routes are selected by name, or by kind (every route of that kind).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from repro.decoding.routes import COMMON_PARAMS, ROUTE_KINDS
from repro.errors import ConfigError

PLACEHOLDER = "<checkpoint>"
"""A template's value for a checkpoint path given at run time."""

CHECKPOINT_OPTIONS = {"drafter": "--drafter [ROUTE=]DIR", "weaver": "--weaver DIR"}


def parse_value(text: str) -> Any:
    """A ``--set`` value read as YAML (``64`` an int, ``true`` a bool, ``[a, b]`` a list), else the text."""
    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def split_assignment(text: str, option: str) -> tuple[str, str]:
    """``KEY=VALUE`` split at the first '='; ConfigError naming ``option`` otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{option} takes KEY=VALUE, got {text!r}")
    return key.strip(), value


def select_routes(routes: list[dict[str, Any]], selector: str, what: str) -> list[dict[str, Any]]:
    """The routes named ``selector``, else those of kind ``selector``; ConfigError when none."""
    named = [r for r in routes if r.get("name") == selector]
    chosen = named or [r for r in routes if r.get("kind") == selector]
    if not chosen:
        names = ", ".join(str(r.get("name") or r.get("kind")) for r in routes)
        raise ConfigError(f"{what}: no route named (or of kind) {selector!r}; the routes are {names}")
    return chosen


def takes_param(route: dict[str, Any], param: str) -> bool:
    """Whether ``route``'s kind declares ``param``, or takes it as every repro route does (``commit``,
    ``acceptance``: :data:`~repro.decoding.routes.COMMON_PARAMS` but the name; an external loop's are
    its own)."""
    kind = ROUTE_KINDS.get(str(route.get("kind")))
    if kind is None:
        return False
    common = param != "name" and any(p.name == param for p in COMMON_PARAMS) and not kind.external
    return common or any(p.name == param for p in kind.params)


def pick_routes(routes: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """The routes named (or of the kind) in ``names``, in that order; a route kind the experiment does
    not list becomes an unnamed route of that kind (checked against the registry when built)."""
    out: list[dict[str, Any]] = []
    for name in names:
        if name in ROUTE_KINDS and not any(name in (r.get("name"), r.get("kind")) for r in routes):
            out.append({"name": name, "kind": name})
        else:
            out += select_routes(routes, name, "--routes")
    return out


def set_checkpoint(raw: dict[str, Any], param: str, spec: str) -> None:
    """``--drafter ROUTE=PATH`` (or ``PATH``: every route taking a ``param``) into ``raw["routes"]``."""
    option = CHECKPOINT_OPTIONS[param].split()[0]
    routes = raw.get("routes") or []
    selector, sep, path = spec.partition("=")
    if sep and param == "drafter":
        chosen = select_routes(routes, selector.strip(), f"{option} {spec}")
    else:
        path, chosen = spec, [r for r in routes if isinstance(r, dict) and takes_param(r, param)]
    if not path:
        raise ConfigError(f"{option} needs a checkpoint path, got {spec!r}")
    if not chosen:
        raise ConfigError(f"{option} {spec}: no route of this experiment takes a {param}")
    for route in chosen:
        if not takes_param(route, param):
            raise ConfigError(
                f"{option} {spec}: route {route.get('name')!r} ({route.get('kind')}) takes no {param}"
            )
        route[param] = path


def set_key(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """``--set a.b=value``: a top-level setting, a key of a mapping setting, or ``routes.ROUTE.PARAM``
    (ROUTE a route name, which may hold dots, or a kind)."""
    parts = dotted.split(".")
    if parts[0] == "routes" and len(parts) >= 3:
        selector, param = ".".join(parts[1:-1]), parts[-1]
        for route in select_routes(raw.get("routes") or [], selector, f"--set {dotted}"):
            route[param] = value
        return
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(parts[: depth + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_edits(
    raw: dict[str, Any],
    sets: list[str] | None = None,
    drafters: list[str] | None = None,
    weaver: str | None = None,
) -> dict[str, Any]:
    """A copy of the raw experiment with ``--set``, ``--drafter`` and ``--weaver`` applied (in that order)."""
    out = copy.deepcopy(raw)
    for text in sets or []:
        key, value = split_assignment(text, "--set")
        set_key(out, key, parse_value(value))
    for spec in drafters or []:
        set_checkpoint(out, "drafter", spec)
    if weaver is not None:
        set_checkpoint(out, "weaver", weaver)
    return out


def unfilled(cfg: dict[str, Any]) -> list[str]:
    """The placeholders still in a resolved config, each with the option that fills it."""
    out = []
    if cfg.get("target") == PLACEHOLDER:
        out.append("target (--target DIR)")
    for route in cfg.get("routes") or []:
        for param, option in CHECKPOINT_OPTIONS.items():
            if route.get(param) == PLACEHOLDER:
                out.append(f"routes.{route['name']}.{param} ({option})")
    return out


def require_filled(cfg: dict[str, Any]) -> None:
    """ConfigError naming every checkpoint a template still needs."""
    missing = unfilled(cfg)
    if missing:
        raise ConfigError(f"experiment {cfg['name']} needs checkpoint path(s): {'; '.join(missing)}")
