"""Route kinds: named compositions of drafter, tree builder and acceptance rule.

A route spec is a dict such as ``{"name": "chain-k4-p0.8", "kind": "synthetic_chain",
"k": 4, "p": 0.8}``; ``kind`` picks a builder below and the other keys are its parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repro.acceptance import make_rule
from repro.drafters.synthetic import SyntheticDrafter
from repro.engine import Route
from repro.errors import ConfigError
from repro.models.hybrid import check_strategy
from repro.trees import Backbone, Chain, SingleNode

COMMON_KEYS = {"name", "kind", "commit"}


def _ar(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    return Route(spec["name"], None, SingleNode(), make_rule(*rule_args))


def _synthetic_chain(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    drafter = SyntheticDrafter(float(spec["p"]), int(spec["k"]), 1, vocab_size, rule_args[2])
    return Route(spec["name"], drafter, Chain(), make_rule(*rule_args))


def _synthetic_tree(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    width = int(spec.get("width", 2))
    drafter = SyntheticDrafter(float(spec["p"]), int(spec["k"]), width, vocab_size, rule_args[2])
    return Route(spec["name"], drafter, Backbone(width), make_rule(*rule_args))


ROUTE_KINDS: dict[str, tuple[Callable[[dict, int, tuple], Route], set[str], str]] = {
    "ar": (_ar, set(), "plain autoregressive decoding (a one-node tree per step)"),
    "synthetic_chain": (_synthetic_chain, {"p", "k"}, "synthetic drafter, chain of k drafts, acceptance p"),
    "synthetic_tree": (
        _synthetic_tree,
        {"p", "k", "width"},
        "synthetic drafter, k levels of `width` distinct siblings, acceptance p per slot",
    ),
}


def route_params(spec: dict) -> dict[str, Any]:
    """The spec without its name: what identifies the route's behaviour in records."""
    return {k: v for k, v in spec.items() if k != "name"}


def build_route(spec: dict, vocab_size: int, acceptance: str, temperature: float, seed: int) -> Route:
    """Instantiate one route from its spec, or raise a one-line ConfigError."""
    kind = spec.get("kind")
    name = spec.get("name") or kind
    if kind not in ROUTE_KINDS:
        raise ConfigError(
            f"unknown route kind {kind!r} (route {name!r}): available kinds are {', '.join(ROUTE_KINDS)}"
        )
    factory, allowed, _ = ROUTE_KINDS[kind]
    extra = set(spec) - allowed - COMMON_KEYS
    if extra:
        raise ConfigError(f"route {name!r} of kind {kind}: unknown parameter(s) {', '.join(sorted(extra))}")
    required = allowed - {"width"}
    missing = required - set(spec)
    if missing:
        raise ConfigError(f"route {name!r} of kind {kind}: missing parameter(s) {', '.join(sorted(missing))}")
    spec = {**spec, "name": name}
    try:
        route = factory(spec, vocab_size, (acceptance, temperature, seed))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"route {name!r}: bad parameter value ({exc})") from None
    route.params = route_params(spec)
    if "commit" in spec:
        route.commit_strategy = check_strategy(spec["commit"])
    return route
