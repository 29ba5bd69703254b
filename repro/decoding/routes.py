"""Route kinds: named compositions of drafter, tree builder and acceptance rule.

A route spec is a dict such as ``{"name": "chain-k4-p0.8", "kind": "synthetic_chain",
"k": 4, "p": 0.8}``; ``kind`` picks a builder below and the other keys are its parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repro.decoding.acceptance import make_rule
from repro.decoding.engine import Route
from repro.decoding.tree_builders import Backbone, BestFirst, Chain, DrafterTree, SingleNode
from repro.drafters.dflash import DFlashDrafter, load_dflash, random_dflash_for
from repro.drafters.eagle import DynamicTree, EagleDrafter, EagleDraftModel, load_eagle, random_eagle_for
from repro.drafters.synthetic import SyntheticDrafter
from repro.drafters.weaver import WeaverDrafter, load_weaver, random_weaver_for
from repro.errors import ConfigError
from repro.models.hybrid import HybridLM, check_strategy

COMMON_KEYS = {"name", "kind", "commit"}
OPTIONAL_KEYS = {"width", "block_size", "topk", "tau", "depth", "pool"}


def _ar(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    return Route(spec["name"], None, SingleNode(), make_rule(*rule_args))


def _synthetic_chain(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    drafter = SyntheticDrafter(float(spec["p"]), int(spec["k"]), 1, vocab_size, rule_args[2])
    return Route(spec["name"], drafter, Chain(), make_rule(*rule_args))


def _synthetic_tree(spec: dict, vocab_size: int, rule_args: tuple) -> Route:
    width = int(spec.get("width", 2))
    drafter = SyntheticDrafter(float(spec["p"]), int(spec["k"]), width, vocab_size, rule_args[2])
    return Route(spec["name"], drafter, Backbone(width), make_rule(*rule_args))


def _need_target(spec: dict, target: HybridLM | None) -> HybridLM:
    if target is None:
        raise ConfigError(f"route kind {spec['kind']} needs the target model: build_route(..., target=model)")
    return target


def _dflash_drafter(spec: dict, rule_args: tuple, target: HybridLM | None) -> DFlashDrafter:
    """``drafter``: a z-lab DFlash checkpoint directory, or "random" (seeded, untrained)."""
    target = _need_target(spec, target)
    block = int(spec["block_size"]) if spec.get("block_size") is not None else None
    source = str(spec["drafter"])
    if source == "random":
        model = random_dflash_for(target, seed=int(rule_args[2]), block_size=block or 16)
    else:
        model = load_dflash(source)
    return DFlashDrafter(model, target, block_size=block)


def _dflash_chain(spec: dict, vocab_size: int, rule_args: tuple, target: HybridLM | None = None) -> Route:
    return Route(spec["name"], _dflash_drafter(spec, rule_args, target), Chain(), make_rule(*rule_args))


def _ddtree(spec: dict, vocab_size: int, rule_args: tuple, target: HybridLM | None = None) -> Route:
    builder = BestFirst(int(spec["budget"]))
    return Route(spec["name"], _dflash_drafter(spec, rule_args, target), builder, make_rule(*rule_args))


def _eagle_model(spec: dict, rule_args: tuple, target: HybridLM) -> EagleDraftModel:
    """``drafter``: an EAGLE checkpoint directory, or "random" (seeded, untrained)."""
    source = str(spec["drafter"])
    if source == "random":
        return random_eagle_for(target, seed=int(rule_args[2]))
    return load_eagle(source, target=target)


def _eagle_chain(spec: dict, vocab_size: int, rule_args: tuple, target: HybridLM | None = None) -> Route:
    target = _need_target(spec, target)
    drafter = EagleDrafter(_eagle_model(spec, rule_args, target), target, k=int(spec["k"]))
    return Route(spec["name"], drafter, Chain(), make_rule(*rule_args))


def _eagle_tree(spec: dict, vocab_size: int, rule_args: tuple, target: HybridLM | None = None) -> Route:
    target = _need_target(spec, target)
    shape = DynamicTree(
        int(spec["budget"]), int(spec.get("topk", 4)), float(spec.get("tau", 0.0)), int(spec.get("depth", 6))
    )
    drafter = EagleDrafter(_eagle_model(spec, rule_args, target), target, tree=shape)
    return Route(spec["name"], drafter, DrafterTree(), make_rule(*rule_args))


def _weaver(spec: dict, vocab_size: int, rule_args: tuple, target: HybridLM | None = None) -> Route:
    """``weaver``: an adapter checkpoint dir, or "random" (seeded, untrained, shaped for the drafter)."""
    dflash = _dflash_drafter(spec, rule_args, target)
    source = str(spec["weaver"])
    if source == "random":
        weaver = random_weaver_for(dflash.model, dflash.target, seed=int(rule_args[2]))
    else:
        weaver = load_weaver(source, dflash.model, dflash.target)
    pool = int(spec["pool"]) if spec.get("pool") is not None else None
    drafter = WeaverDrafter(weaver, dflash, int(spec["budget"]), int(spec.get("width", 4)), pool)
    return Route(spec["name"], drafter, DrafterTree(), make_rule(*rule_args))


ROUTE_KINDS: dict[str, tuple[Callable[..., Route], set[str], str]] = {
    "ar": (_ar, set(), "plain autoregressive decoding (a one-node tree per step)"),
    "synthetic_chain": (_synthetic_chain, {"p", "k"}, "synthetic drafter, chain of k drafts, acceptance p"),
    "synthetic_tree": (
        _synthetic_tree,
        {"p", "k", "width"},
        "synthetic drafter, k levels of `width` distinct siblings, acceptance p per slot",
    ),
    "dflash_chain": (
        _dflash_chain,
        {"drafter", "block_size"},
        "DFlash block drafter (checkpoint dir or 'random'), argmax chain of block_size-1 drafts",
    ),
    "ddtree": (
        _ddtree,
        {"drafter", "budget", "block_size"},
        "DFlash marginals, DDTree best-first tree of `budget` draft nodes",
    ),
    "eagle_chain": (
        _eagle_chain,
        {"drafter", "k"},
        "EAGLE feature drafter (checkpoint dir or 'random'), argmax chain of k drafts",
    ),
    "eagle_tree": (
        _eagle_tree,
        {"drafter", "budget", "topk", "tau", "depth"},
        "EAGLE-2 dynamic tree: per level the `topk` best nodes get `topk` children each (drafter "
        "probability >= `tau`), `depth` levels, the best `budget` draft nodes",
    ),
    "weaver": (
        _weaver,
        {"drafter", "weaver", "budget", "pool", "width", "block_size"},
        "DFlash top-`pool` pool, Weaver-grown best-first tree of `budget` nodes, `width` per step",
    ),
}
TARGET_KINDS = {"dflash_chain", "ddtree", "eagle_chain", "eagle_tree", "weaver"}  # take the target


def route_params(spec: dict) -> dict[str, Any]:
    """The spec without its name: what identifies the route's behaviour in records."""
    return {k: v for k, v in spec.items() if k != "name"}


def build_route(
    spec: dict,
    vocab_size: int,
    acceptance: str,
    temperature: float,
    seed: int,
    target: HybridLM | None = None,
) -> Route:
    """Instantiate one route from its spec, or raise a one-line ConfigError.

    ``target`` is the model the route decodes; drafters that read its weights or hidden states
    (the DFlash and EAGLE kinds) need it.
    """
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
    required = allowed - OPTIONAL_KEYS
    missing = required - set(spec)
    if missing:
        raise ConfigError(f"route {name!r} of kind {kind}: missing parameter(s) {', '.join(sorted(missing))}")
    spec = {**spec, "name": name}
    try:
        rule_args = (acceptance, temperature, seed)
        if kind in TARGET_KINDS:
            route = factory(spec, vocab_size, rule_args, target=target)
        else:
            route = factory(spec, vocab_size, rule_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"route {name!r}: bad parameter value ({exc})") from None
    route.params = route_params(spec)
    if "commit" in spec:
        route.commit_strategy = check_strategy(spec["commit"])
    return route
