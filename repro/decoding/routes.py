"""Route kinds: named compositions of drafter, tree builder, acceptance rule and commit strategy.

A route spec is a dict such as ``{"name": "chain-k4-p0.8", "kind": "synthetic_chain", "k": 4,
"p": 0.8}``; ``kind`` picks a :class:`RouteKind` of :data:`ROUTE_KINDS` and the other keys are its
parameters. Each kind is declared once, below: its parameters (type, default or required, bounds,
help) drive validation, the resolved parameters that records carry, ``repro routes``, the
``--route`` help of ``repro generate`` and ``docs/routes.md`` (:func:`routes_markdown`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from repro.decoding.acceptance import ACCEPTANCE_RULES, DISTRIBUTIONAL_RULES, TargetMatch, make_rule
from repro.decoding.engine import Route, decode_loop, prepare_sampling
from repro.decoding.tree_builders import Backbone, BestFirst, Chain, DrafterTree, SingleNode, TreeBuilder
from repro.drafters.base import Drafter
from repro.drafters.dflash import DFlashDrafter, load_dflash, random_dflash_for
from repro.drafters.eagle import DynamicTree, EagleDraftModel, load_eagle, random_eagle_for
from repro.drafters.static_eagle import eagle_drafter_for
from repro.drafters.synthetic import SyntheticDrafter
from repro.drafters.weaver import WeaverDrafter, load_weaver, random_weaver_for
from repro.errors import ConfigError
from repro.models.family import DEFAULT_TARGET, drafter_name, members
from repro.models.graphed import GraphedTarget
from repro.models.hybrid import HybridLM, check_verifier_name
from repro.models.static import DELAYED, STATIC_STRATEGIES, check_static_strategy
from repro.tree import MAX_TREE_NODES


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a parameter that every spec must give."""

RANDOM = "random"  # a seeded, untrained drafter shaped for the target


@dataclass(frozen=True)
class Param:
    """One route parameter: its type, default (or :data:`REQUIRED`), bounds or choices, and help.

    ``default=None`` means "decided when the route is built" (``unset`` says by what; the built
    value is recorded). ``checkpoint`` names the family drafter kind (``dflash``, ``eagle``,
    ``weaver``) of a parameter that takes a checkpoint directory, a family name or ``random``;
    on a family target it defaults to the target's own drafter of that kind.
    """

    name: str
    type: type
    help: str
    default: Any = REQUIRED
    min: float | None = None
    max: float | None = None
    max_open: bool = False  # max itself is excluded
    choices: tuple[str, ...] = ()
    unset: str = ""
    checkpoint: str | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def allowed(self) -> str:
        """The allowed values in words, e.g. ``an integer >= 1`` or ``a number in [0, 1]``."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.checkpoint:
            return f"a checkpoint directory, a family name or {RANDOM!r}"
        what = {int: "an integer", float: "a number", str: "a string that is not blank"}[self.type]
        if self.min is not None and self.max is not None:
            return f"{what} in [{_num(self.min)}, {_num(self.max)}{')' if self.max_open else ']'}"
        if self.min is not None:
            return f"{what} >= {_num(self.min)}"
        return what

    def default_text(self) -> str:
        if self.required:
            return "required" + (" (family target: its own drafter)" if self.checkpoint else "")
        if self.default is None:
            return self.unset or "-"
        return repr(self.default) if isinstance(self.default, str) else str(self.default)

    def check(self, value: Any) -> Any:
        """``value`` as this parameter's type, or ValueError naming what is allowed.

        Ints refuse bools, strings and non-integral floats (3.0 is 3); floats take ints.
        """
        if value is None and self.default is None:
            return None
        if self.type is int:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
            value = int(value) if ok else value
        elif self.type is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str) and value.strip() != ""
        if ok and self.choices:
            ok = value in self.choices
        if ok and self.min is not None:
            ok = value >= self.min
        if ok and self.max is not None:
            ok = value < self.max if self.max_open else value <= self.max
        if not ok:
            raise ValueError(f"{self.name} must be {self.allowed()}, got {value!r}")
        return value

    def parse(self, text: str) -> Any:
        """A command-line value (``--param KEY=VALUE``) converted by this parameter's type."""
        if self.type is str:
            return text
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text  # refused by check, with the allowed range


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass
class BuildContext:
    """What a factory may use besides the parameters: vocabulary, drafter seed, the target, and the
    constructors of ``random`` drafters by kind (``dflash``, ``eagle``, ``weaver``; default: the
    drafters' ``random_*_for``, called with the same arguments)."""

    vocab_size: int
    seed: int
    target: HybridLM | None
    random_drafters: dict[str, Callable[..., Any]] = field(default_factory=dict)


Factory = Callable[[dict[str, Any], BuildContext], tuple[Drafter | None, TreeBuilder]]


@dataclass(frozen=True)
class RouteKind:
    """One route kind: name, help, parameters and the factory of its drafter and tree builder.

    The factory gets the resolved parameters (every declared one, defaults filled in) and may
    fill in those whose default is None (decided by a checkpoint) with the built value.
    """

    name: str
    help: str
    params: tuple[Param, ...]
    factory: Factory
    needs_target: bool = False
    verifier: str = "tree"  # how the target verifies (HybridLM.verify): "tree", or "chain" (stock fla path)
    commits: tuple[str, ...] = STATIC_STRATEGIES  # the commit strategies the kind can use
    defaults: dict[str, Any] = field(default_factory=dict)  # its own defaults of common parameters
    alias_of: str | None = None  # the kind whose declaration this one reuses under its own name
    external: bool = (
        False  # another implementation's loop: the harness runs it (repro.engines), not build_route
    )

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


def alias(name: str, of: RouteKind, help: str, **defaults: Any) -> RouteKind:
    """Kind ``of`` under another name (records and reports carry ``name``), with its own defaults of
    the common parameters (e.g. ``commit``)."""
    return replace(of, name=name, help=help, defaults=defaults, alias_of=of.name)


COMMON_PARAMS = (
    Param("name", str, "the route's name in records and reports", default=None, unset="the kind"),
    Param(
        "commit",
        str,
        "how accepted paths are folded into the state (`delayed`: the closed form, folded in by the next "
        "verification's tree kernel on the graphed engine; `closed_form` on the eager one)",
        default=None,
        choices=STATIC_STRATEGIES,
        unset="the experiment's `commit` (generate: --commit)",
    ),
    Param(
        "acceptance",
        str,
        "how the verified tree is accepted (docs/metrics.md, Acceptance rules)",
        default=None,
        choices=ACCEPTANCE_RULES,
        unset="the experiment's `acceptance`",
    ),
)


# --------------------------------------------------------------------------- factories


def _ar(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    return None, SingleNode()


def _synthetic_chain(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    return SyntheticDrafter(p["p"], p["k"], 1, ctx.vocab_size, ctx.seed), Chain()


def _synthetic_tree(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    drafter = SyntheticDrafter(p["p"], p["k"], p["width"], ctx.vocab_size, ctx.seed)
    return drafter, Backbone(p["width"])


def _dflash(p: dict[str, Any], ctx: BuildContext) -> DFlashDrafter:
    """The DFlash drafter of ``p["drafter"]``; records the block size it runs with."""
    assert ctx.target is not None
    if p["drafter"] == RANDOM:
        make = ctx.random_drafters.get("dflash", random_dflash_for)
        model = make(ctx.target, seed=ctx.seed, block_size=p["block_size"] or 16)
    else:
        model = load_dflash(p["drafter"])
    drafter = DFlashDrafter(model, ctx.target, block_size=p["block_size"])
    p["block_size"] = drafter.block_size
    return drafter


def _dflash_chain(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    return _dflash(p, ctx), Chain(sample=p["draft"] == "sample")


def _ddtree(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    return _dflash(p, ctx), BestFirst(p["budget"], sample=p["draft"] == "sample")


def _eagle_model(p: dict[str, Any], ctx: BuildContext) -> EagleDraftModel:
    assert ctx.target is not None
    if p["drafter"] == RANDOM:
        return ctx.random_drafters.get("eagle", random_eagle_for)(ctx.target, seed=ctx.seed)
    return load_eagle(p["drafter"], target=ctx.target)


def _eagle_chain(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    assert ctx.target is not None
    return eagle_drafter_for(_eagle_model(p, ctx), ctx.target, k=p["k"]), Chain()


def _fla_sd(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    return _eagle_chain(p, ctx)


def _eagle_tree(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    assert ctx.target is not None
    shape = DynamicTree(p["budget"], p["topk"], p["tau"], p["depth"])
    return eagle_drafter_for(_eagle_model(p, ctx), ctx.target, tree=shape), DrafterTree()


def _weaver(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    dflash = _dflash(p, ctx)
    if p["weaver"] == RANDOM:
        weaver = ctx.random_drafters.get("weaver", random_weaver_for)(
            dflash.model, dflash.target, seed=ctx.seed
        )
    else:
        weaver = load_weaver(p["weaver"], dflash.model, dflash.target)
    drafter = WeaverDrafter(weaver, dflash, p["budget"], p["width"], p["pool"])
    p["pool"] = drafter.pool
    return drafter, DrafterTree()


def _external(p: dict[str, Any], ctx: BuildContext) -> tuple[Drafter | None, TreeBuilder]:
    raise ConfigError("an external route is run by the harness (repro.engines), not built by build_route")


# --------------------------------------------------------------------------- the registry

EXTERNAL = "external"
# the loops of repro.engines.catalog an external route can name (tests/engines pins the two lists equal)
EXTERNAL_ENGINES = (
    "transformers-generate", "transformers-assisted", "transformers-assisted-perturbed",
    "transformers-assisted-dflash", "dflash-generate",
    "sglang-ar", "sglang-dflash", "sglang-eagle", "vllm-ar", "vllm-dflash", "vllm-eagle",
)  # fmt: skip

_P = Param("p", float, "probability that each draft token equals AR's", min=0, max=1)
_K = Param("k", int, "draft tokens per step (tree levels)", min=1)
_BUDGET = Param("budget", int, "draft nodes per tree (the root excluded)", min=1, max=MAX_TREE_NODES - 1)
_DFLASH = Param("drafter", str, "the DFlash drafter", checkpoint="dflash")
_EAGLE = Param("drafter", str, "the EAGLE drafter", checkpoint="eagle")
_DRAFT = Param(
    "draft", str, "draft tokens: the marginals' top ones, or drawn from them (docs/metrics.md)",
    default="top", choices=("top", "sample"),
)  # fmt: skip
_BLOCK = Param(
    "block_size", int, "DFlash block (pending token + block_size - 1 drafts)", default=None, min=2,
    unset="the checkpoint's (random: 16)",
)  # fmt: skip

_KINDS: tuple[RouteKind, ...] = (
    RouteKind("ar", "plain autoregressive decoding (a one-node tree per step)", (), _ar),
    RouteKind(
        "synthetic_chain",
        "synthetic drafter (needs AR's output as reference): a chain of k drafts, each equal to "
        "AR's token with probability p",
        (_P, _K),
        _synthetic_chain,
    ),
    RouteKind(
        "synthetic_tree",
        "synthetic drafter: k levels of `width` distinct siblings under the first choice, "
        "acceptance p per level",
        (_P, _K, Param("width", int, "siblings per level", default=2, min=1)),
        _synthetic_tree,
    ),
    RouteKind(
        "dflash_chain",
        "DFlash block drafter, a chain of block_size - 1 drafts (argmax, or sampled: `draft`)",
        (_DFLASH, _BLOCK, _DRAFT),
        _dflash_chain,
        needs_target=True,
    ),
    RouteKind(
        "ddtree",
        "DFlash per-depth marginals, DDTree best-first tree of `budget` draft nodes",
        (_DFLASH, _BUDGET, _BLOCK, _DRAFT),
        _ddtree,
        needs_target=True,
    ),
    RouteKind(
        "eagle_chain",
        "EAGLE feature drafter, argmax chain of k drafts",
        (_EAGLE, Param("k", int, "draft tokens per step", min=1)),
        _eagle_chain,
        needs_target=True,
    ),
    RouteKind(
        "eagle_tree",
        "EAGLE-2 dynamic tree: per level the `topk` best nodes get `topk` children each (drafter "
        "probability >= `tau`), `depth` levels, the best `budget` draft nodes",
        (
            _EAGLE,
            _BUDGET,
            Param("topk", int, "nodes expanded per level and children per node", default=4, min=1),
            Param(
                "tau",
                float,
                "least drafter probability of a child",
                default=0.0,
                min=0,
                max=1,
                max_open=True,
            ),
            Param("depth", int, "levels grown", default=6, min=1),
        ),
        _eagle_tree,
        needs_target=True,
    ),
    RouteKind(
        "weaver",
        "DFlash top-`pool` candidates per depth, Weaver-grown best-first tree of `budget` nodes, "
        "`width` frontier nodes taken and scored per Weaver step (1: exact best-first)",
        (
            _DFLASH,
            Param("weaver", str, "the Weaver adapter (shaped for the drafter)", checkpoint="weaver"),
            _BUDGET,
            Param("pool", int, "DFlash candidates per depth", default=None, min=1, unset="the adapter's"),
            Param("width", int, "frontier nodes per Weaver step (the paper's w)", default=4, min=1),
            _BLOCK,
        ),
        _weaver,
        needs_target=True,
    ),
    RouteKind(
        "fla_sd",
        "SpecLA's FLA-SD baseline: the EAGLE argmax chain of k drafts verified by the stock chunk "
        "kernel from the committed state (fla's `chunk_gated_delta_rule`; torch reference on CPU) and "
        "committed by replaying the accepted tokens through fla's `fused_recurrent_gated_delta_rule`",
        (_EAGLE, Param("k", int, "draft tokens per step", min=1)),
        _fla_sd,
        needs_target=True,
        verifier="chain",
        commits=("replay",),
        defaults={"commit": "replay"},
    ),
    RouteKind(
        EXTERNAL,
        "another implementation's decode loop (`engine`) on the run's target checkpoint and prompts, "
        "judged against the run's AR like every route (docs/usage.md, External routes)",
        (
            Param(
                "engine",
                str,
                "the external loop (`repro falsify external --engines`)",
                choices=EXTERNAL_ENGINES,
            ),
            Param(
                "drafter",
                str,
                "its drafter checkpoint (engines that take one)",
                default=None,
                unset="family target: its own drafter of the engine's kind; none for the others",
            ),
        ),
        _external,
        external=True,
    ),
)
_BY_NAME = {kind.name: kind for kind in _KINDS}
ROUTE_KINDS: dict[str, RouteKind] = {
    **_BY_NAME,
    "dflash_tfm": alias(
        "dflash_tfm",
        _BY_NAME["weaver"],
        "Weaver's DFlash-TfM (the paper's name of the `weaver` kind): DFlash top-`pool` candidates per "
        "depth, Weaver-grown best-first tree of `budget` nodes",
    ),
    "specla": alias(
        "specla",
        _BY_NAME["eagle_tree"],
        "SpecLA's route: EAGLE drafter, confidence-pruned dynamic tree (`tau`, `topk`, `depth`, `budget`), "
        "tree-masked verify, closed-form state commit (delayed into the next verification on the graphed "
        "engine)",
        commit=DELAYED,
    ),
}


# --------------------------------------------------------------------------- resolution


def route_kind(kind: Any, name: Any = None) -> RouteKind:
    if kind not in ROUTE_KINDS:
        route = f" (route {name!r})" if name else ""
        raise ConfigError(f"unknown route kind {kind!r}{route}: available kinds are {', '.join(ROUTE_KINDS)}")
    return ROUTE_KINDS[kind]


def family_of(target: str | None) -> str | None:
    """The family target a target spec names ("default" is the default member), else None."""
    name = DEFAULT_TARGET if target == "default" else target
    return name if name in members() else None


def resolve_spec(spec: dict[str, Any], family: str | None = None) -> dict[str, Any]:
    """The validated spec with every declared parameter (defaults filled in), or a one-line
    ConfigError naming route, parameter, value and the allowed values.

    An unnamed route is named by its kind. A missing checkpoint parameter defaults to the
    ``family`` target's own drafter of that kind, when the family ships one.
    """
    kind = route_kind(spec.get("kind"), spec.get("name"))
    name = spec.get("name") or kind.name
    where = f"route {name!r} ({kind.name})"
    known = {p.name for p in kind.params + COMMON_PARAMS} | {"kind"}
    unknown = sorted(set(spec) - known)
    if unknown:
        takes = ", ".join(p.name for p in kind.params) or "no parameters"
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join(unknown)}; {kind.name} takes {takes}")
    out: dict[str, Any] = {"name": name, "kind": kind.name}
    missing = []
    for param in COMMON_PARAMS[1:] + kind.params:
        if param.name in spec:
            value = spec[param.name]
        elif param.name in kind.defaults:
            value = kind.defaults[param.name]
        elif param.checkpoint and family and drafter_name(family, param.checkpoint) in members():
            value = drafter_name(family, param.checkpoint)
        elif param.required:
            missing.append(param.name)
            continue
        else:
            value = param.default
        try:
            out[param.name] = param.check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if missing:
        raise ConfigError(f"{where}: missing parameter(s) {', '.join(missing)}")
    if out["commit"] is not None and out["commit"] not in kind.commits:
        raise ConfigError(f"{where}: commit must be one of {', '.join(kind.commits)}, got {out['commit']!r}")
    return out


def name_routes(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The specs with unnamed ones named by their kind; route names must be unique."""
    unnamed: dict[Any, int] = {}
    for spec in specs:
        if not spec.get("name"):
            unnamed[spec.get("kind")] = unnamed.get(spec.get("kind"), 0) + 1
    for kind, count in unnamed.items():
        if count > 1:
            raise ConfigError(f"{count} routes of kind {kind} need distinct `name`s")
    out = [{**spec, "name": spec.get("name") or spec.get("kind")} for spec in specs]
    names = [str(s["name"]) for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"route names must be unique: {', '.join(twice)} named more than once")
    return out


def build_route(
    spec: dict,
    vocab_size: int,
    acceptance: str,
    temperature: float,
    seed: int,
    target: HybridLM | None = None,
    *,
    commit: str = "closed_form",
    family: str | None = None,
    random_drafters: dict[str, Callable[..., Any]] | None = None,
) -> Route:
    """Instantiate one route from its spec, or raise a one-line ConfigError.

    ``target`` is the model the route decodes; drafters that read its weights or hidden states
    (the DFlash and EAGLE kinds) need it. ``commit`` is the strategy of routes whose spec has no
    ``commit`` (``delayed`` becomes ``closed_form`` unless ``target`` is a
    :class:`~repro.models.graphed.GraphedTarget`); ``family`` the family target name whose drafters are
    the checkpoint defaults;
    ``random_drafters`` the constructors of ``random`` drafters by kind (:class:`BuildContext`).
    ``route.params`` are the resolved parameters (commit and built values included). AR under
    spec_sampling or traversal is AR under sample_match (its params say so): with no drafts every
    lossless rule samples the target, and sample_match's position-keyed pick is the one the graphed
    engine makes on the device (a rule's step stream would be drawn on the host, a sync a token).
    """
    check_static_strategy(commit)
    params = resolve_spec(spec, family)
    kind = ROUTE_KINDS[params["kind"]]
    name = params.pop("name")
    if kind.external:
        raise ConfigError(
            f"route {name!r} ({kind.name}) runs another implementation's decode loop: only `repro run`"
            " (an experiment's routes) runs it"
        )
    params["commit"] = params["commit"] or (commit if commit in kind.commits else kind.commits[0])
    if params["commit"] == DELAYED and not isinstance(target, GraphedTarget):
        params["commit"] = "closed_form"  # the same commit, at commit time: what the eager engine runs
    params["acceptance"] = params["acceptance"] or acceptance
    if kind.name == "ar" and params["acceptance"] in DISTRIBUTIONAL_RULES:
        params["acceptance"] = "sample_match"  # no drafts: AR's law is the target's under every rule
    if kind.needs_target and target is None:
        raise ConfigError(f"route kind {kind.name} needs the target model: build_route(..., target=model)")
    drafter, builder = kind.factory(
        params, BuildContext(vocab_size, seed, target, dict(random_drafters or {}))
    )
    rule = route_rule(name, params["acceptance"], temperature, seed)
    return Route(name, drafter, builder, rule, params, params["commit"], kind.verifier)


def route_rule(name: str, acceptance: str, temperature: float, seed: int) -> TargetMatch:
    """Route ``name``'s acceptance rule (:func:`make_rule`), or a one-line ConfigError naming the route."""
    try:
        return make_rule(acceptance, temperature, seed)
    except ConfigError as exc:
        raise ConfigError(f"route {name!r}: {exc}") from None


# --------------------------------------------------------------------------- documentation


def _param_rows(kind: RouteKind) -> list[tuple[str, str, str, str, str]]:
    """(name, type, default, allowed, help) of each parameter of ``kind``."""
    return [(p.name, p.type.__name__, p.default_text(), p.allowed(), p.help) for p in kind.params]


def route_help() -> str:
    """The ``--route`` help of ``repro generate``: every kind."""
    return f"Route kind: {', '.join(ROUTE_KINDS)} (parameters: `repro routes`)."


def routes_text() -> str:
    """What ``repro routes`` prints: each kind, its help and parameters."""
    lines = []
    for kind in ROUTE_KINDS.values():
        lines.append(f"{kind.name}: {kind.help}")
        for name, typ, default, allowed, help_text in _param_rows(kind):
            lines.append(f"  {name:11s} {typ:5s} {default:34s} {allowed}: {help_text}")
        if not kind.params:
            lines.append("  (no parameters)")
    lines.append("every route also takes:")
    for p in COMMON_PARAMS:
        lines.append(
            f"  {p.name:11s} {p.type.__name__:5s} default {p.default_text()}; {p.allowed()}: {p.help}"
        )
    return "\n".join(lines)


def routes_markdown() -> str:
    """``docs/routes.md``: the route kinds and their parameters, generated from :data:`ROUTE_KINDS`."""
    out = [
        "# Routes",
        "",
        "<!-- generated by repro.decoding.routes.routes_markdown(); do not edit by hand -->",
        "",
        "A route is a spec such as `{name: ddtree-b32, kind: ddtree, drafter: tiny-qwen35-dflash, "
        "budget: 32}` in an experiment's `routes:` list, or `repro generate --route KIND --param KEY=VALUE` "
        "(`--drafter DIR` and `--weaver DIR` set the checkpoint parameters). Integers refuse fractions "
        "(`k: 2.7`); bounds are checked; a record's `route_params` holds the resolved values, "
        "defaults included.",
        "",
        "Every route also takes:",
        "",
    ]
    for p in COMMON_PARAMS:
        out.append(f"- `{p.name}` ({p.allowed()}; default: {p.default_text()}): {p.help}")
    out.append(
        "- an unnamed route is named by its kind; two unnamed routes of one kind need distinct `name`s"
    )
    for kind in ROUTE_KINDS.values():
        out += ["", f"## `{kind.name}`", "", kind.help[0].upper() + kind.help[1:] + "."]
        if kind.alias_of:
            out.append(
                f"An alias of `{kind.alias_of}` (same parameters and factory), reported under its own name."
            )
        if kind.defaults:
            out.append("Defaults: " + ", ".join(f"`{k}: {v}`" for k, v in kind.defaults.items()) + ".")
        if kind.commits != STATIC_STRATEGIES:
            out.append(f"Commit: {', '.join(kind.commits)} only.")
        if kind.needs_target:
            out.append("Reads the target's weights or hidden states.")
        if kind.external:
            out.append(
                "Run by `repro run` through `repro.engines` (its package must be installed; checked at "
                "`--check` and at start); `commit` and `acceptance` are the loop's own."
            )
        out.append("")
        if not kind.params:
            out.append("No parameters.")
            continue
        out += ["| parameter | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        for name, typ, default, allowed, help_text in _param_rows(kind):
            out.append(f"| `{name}` | {typ} | {default} | {allowed} | {help_text} |")
    return "\n".join(out) + "\n"


def prepare_graphs(target: GraphedTarget, routes: list[Route]) -> None:
    """Make ahead the graphs of the routes' commit strategies, verifiers, captured layers and sampling
    rules' device acceptance, each for the loop that decodes the route (:func:`~repro.decoding.engine.
    decode_loop`), so that none is captured or compiled inside a timed decode and none is made unused."""
    for route in routes:
        check_verifier_name(route.verifier)
    capture = tuple(i for r in routes if r.drafter for i in r.drafter.capture_layers)
    largest = max(largest_tree(r) for r in routes)
    target.prepare(())  # the decode graphs (AR's)
    loops = [decode_loop(target, r) for r in routes]
    for loop in ("host", "stepwise", "pipelined"):  # each loop's step graphs, for the drafted routes it runs
        group = [r for r, its in zip(routes, loops) if its == loop and not isinstance(r.builder, SingleNode)]
        if group:
            trees = tuple(r.commit for r in group if r.verifier == "tree")
            chain = any(r.verifier == "chain" for r in group)
            size = max(largest_tree(r) for r in group)
            target.prepare(trees, capture, size, chain, loop)
    prepare_sampling(target, routes, largest)  # the sampling rules' device twins, where routes sample


def largest_tree(route: Route) -> int:
    """The most nodes a route's trees hold, from its parameters (budget, k levels of width siblings,
    a DFlash block), at least 64; larger trees than this get their graphs on first use."""
    p = route.params
    drafts = max(p.get("budget") or 0, (p.get("k") or 0) * (p.get("width") or 1), p.get("block_size") or 0)
    return max(64, drafts + 1)
