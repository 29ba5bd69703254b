"""The route registry: typed, bounded parameters with one-line errors, resolved parameters in
records, default names, typed ``--param`` values and ``--drafter``, the generated docs and help, and
per-route commit strategies that never leak from one route into the next."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from repro.decoding import engine
from repro.decoding.routes import (
    ROUTE_KINDS,
    build_route,
    family_of,
    name_routes,
    resolve_spec,
    route_help,
    routes_markdown,
    routes_text,
)
from repro.errors import ConfigError
from repro.harness import evaluation, runner
from repro.harness.experiment import resolve
from repro.harness.generate import generate_one, parse_params
from repro.models.layers import GatedDeltaNet

ROOT = Path(__file__).resolve().parents[2]
V = 260
CHAIN = {"name": "c", "kind": "synthetic_chain", "p": 0.5, "k": 2}
DDTREE = {"name": "d", "kind": "ddtree", "drafter": "random", "budget": 4}
EAGLE_TREE = {"name": "e", "kind": "eagle_tree", "drafter": "random", "budget": 4}
WEAVER = {"name": "w", "kind": "weaver", "drafter": "random", "weaver": "random", "budget": 4}


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({**CHAIN, "k": 2.7}, "k must be an integer >= 1, got 2.7"),
        ({**CHAIN, "k": "abc"}, "k must be an integer >= 1, got 'abc'"),
        ({**CHAIN, "k": "3"}, "k must be an integer >= 1, got '3'"),
        ({**CHAIN, "k": True}, "k must be an integer >= 1, got True"),
        ({**CHAIN, "k": 0}, "k must be an integer >= 1, got 0"),
        ({**CHAIN, "p": 1.5}, "p must be a number in [0, 1], got 1.5"),
        ({**CHAIN, "p": -0.1}, "p must be a number in [0, 1], got -0.1"),
        ({**CHAIN, "p": "high"}, "p must be a number in [0, 1], got 'high'"),
        (
            {"name": "t", "kind": "synthetic_tree", "p": 0.5, "k": 2, "width": 0},
            "width must be an integer >= 1",
        ),
        ({**DDTREE, "block_size": 0}, "block_size must be an integer >= 2, got 0"),
        ({**DDTREE, "block_size": 1}, "block_size must be an integer >= 2, got 1"),
        ({**DDTREE, "budget": 0}, "budget must be an integer in [1, 1023], got 0"),
        ({**DDTREE, "budget": 1024}, "budget must be an integer in [1, 1023], got 1024"),
        ({**DDTREE, "drafter": ""}, "drafter must be a checkpoint directory, a family name or 'random'"),
        (
            {**DDTREE, "drafter": 3},
            "drafter must be a checkpoint directory, a family name or 'random', got 3",
        ),
        ({**EAGLE_TREE, "topk": 0}, "topk must be an integer >= 1, got 0"),
        ({**EAGLE_TREE, "tau": 1.0}, "tau must be a number in [0, 1), got 1.0"),
        ({**EAGLE_TREE, "tau": -0.5}, "tau must be a number in [0, 1), got -0.5"),
        ({**EAGLE_TREE, "depth": 0}, "depth must be an integer >= 1, got 0"),
        ({**WEAVER, "pool": 0}, "pool must be an integer >= 1, got 0"),
        ({**CHAIN, "commit": "magic"}, "commit must be one of snapshot, replay, closed_form, delayed, got"),
        ({**CHAIN, "q": 1}, "unknown parameter(s) q; synthetic_chain takes p, k"),
        ({"name": "a", "kind": "ar", "k": 1}, "unknown parameter(s) k; ar takes no parameters"),
        ({"name": "c", "kind": "synthetic_chain", "p": 0.5}, "missing parameter(s) k"),
        ({"name": "d", "kind": "ddtree", "budget": 4}, "missing parameter(s) drafter"),
        ({"name": "x", "kind": "dflashh"}, "unknown route kind 'dflashh' (route 'x')"),
    ],
)
def test_bad_parameters_give_one_line_errors_naming_route_param_value_and_range(spec, needle):
    with pytest.raises(ConfigError) as err:
        build_route(spec, V, "greedy", 0.0, 0, target=None)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg
    if "kind" in spec and spec["kind"] in ROUTE_KINDS:
        assert msg.startswith(f"route {spec['name']!r} ({spec['kind']}): ")


def test_integral_floats_are_ints_and_ints_are_floats():
    route = build_route({**CHAIN, "k": 3.0, "p": 1}, V, "greedy", 0.0, 0)
    assert route.params["k"] == 3 and type(route.params["k"]) is int
    assert route.params["p"] == 1.0 and type(route.params["p"]) is float
    assert route.drafter.depth == 3


def test_records_carry_resolved_parameters(model64):
    """Defaults (including those a checkpoint decides) and the commit strategy are filled in."""
    tree = build_route({"kind": "synthetic_tree", "p": 0.5, "k": 2}, V, "greedy", 0.0, 0, commit="replay")
    assert tree.name == "synthetic_tree" and tree.commit == "replay"
    assert tree.params == {
        "kind": "synthetic_tree", "commit": "replay", "acceptance": "greedy", "p": 0.5, "k": 2, "width": 2,
    }  # fmt: skip
    ddtree = build_route(DDTREE, V, "greedy", 0.0, 0, target=model64)
    assert ddtree.params == {
        "kind": "ddtree", "commit": "closed_form", "acceptance": "greedy", "drafter": "random", "budget": 4,
        "block_size": 16, "draft": "top",
    }  # fmt: skip
    assert ddtree.drafter.block_size == 16
    eagle = build_route(EAGLE_TREE, V, "greedy", 0.0, 0, target=model64)
    assert {k: eagle.params[k] for k in ("topk", "tau", "depth")} == {"topk": 4, "tau": 0.0, "depth": 6}
    weaver = build_route({**WEAVER, "block_size": 8}, V, "greedy", 0.0, 0, target=model64)
    assert weaver.params["pool"] == weaver.drafter.pool >= 1 and weaver.params["width"] == 4
    assert weaver.params["block_size"] == 8 == weaver.drafter.dflash.block_size


@pytest.mark.parametrize("acceptance", ["spec_sampling", "traversal"])
def test_ar_under_a_sampling_rule_is_sample_match_ar(model64, acceptance):
    """With no drafts every lossless rule samples the target: an AR route under spec_sampling or traversal
    is sample_match AR (its params say so; its picks run on the graphed engine's device path), while a
    drafted route keeps the rule."""
    from repro.decoding.acceptance import SpecSampling, TargetMatch
    from repro.models.graphed import GraphedTarget

    ar = build_route({"kind": "ar"}, V, acceptance, 0.9, 11)
    assert ar.params["acceptance"] == "sample_match" and type(ar.rule) is TargetMatch
    assert (ar.rule.temperature, ar.rule.seed) == (0.9, 11)
    assert engine.device_ar_sampling(GraphedTarget(model64, max_nodes=8, graphs=False), ar)
    chain = build_route(CHAIN, V, "spec_sampling", 0.9, 11)
    assert chain.params["acceptance"] == "spec_sampling" and type(chain.rule) is SpecSampling


def test_checkpoint_parameters_default_to_the_family_targets_own_drafters():
    assert family_of("default") == "tiny-qwen35" and family_of("tiny-gdn") == "tiny-gdn"
    assert family_of("tiny-random") is None and family_of("/some/dir") is None
    spec = {"kind": "weaver", "budget": 8}
    resolved = resolve_spec(spec, family_of("default"))
    assert resolved["drafter"] == "tiny-qwen35-dflash" and resolved["weaver"] == "tiny-qwen35-weaver"
    assert resolve_spec({"kind": "eagle_chain", "k": 3}, "tiny-gdn")["drafter"] == "tiny-gdn-eagle"
    assert resolve_spec({**spec, "drafter": "random"}, "tiny-gdn")["drafter"] == "random"  # given wins
    with pytest.raises(ConfigError, match="missing parameter\\(s\\) drafter, weaver"):
        resolve_spec(spec, family_of("tiny-random"))


def test_unnamed_routes_are_named_by_kind_and_names_must_be_unique():
    named = name_routes([{"kind": "ar"}, {"kind": "synthetic_chain", "p": 0.5, "k": 2}, {**CHAIN}])
    assert [s["name"] for s in named] == ["ar", "synthetic_chain", "c"]
    with pytest.raises(ConfigError, match="^2 routes of kind synthetic_chain need distinct `name`s$"):
        name_routes([{"kind": "synthetic_chain", "k": 2}, {"kind": "synthetic_chain", "k": 4}])
    with pytest.raises(ConfigError, match="^route names must be unique: c named more than once$"):
        name_routes([CHAIN, {**CHAIN, "k": 5}])
    cfg = resolve({"name": "t", "routes": [{"kind": "synthetic_chain", "p": 0.5, "k": 2}]}, {})
    assert [r["name"] for r in cfg["routes"]] == ["ar", "synthetic_chain"]
    with pytest.raises(ConfigError, match="distinct `name`s"):
        resolve({"name": "t", "routes": [{"kind": "synthetic_chain"}, {"kind": "synthetic_chain"}]}, {})


def test_param_values_are_converted_by_declared_type():
    assert parse_params("ddtree", ["budget=8", "drafter=random"]) == {"budget": 8, "drafter": "random"}
    assert parse_params("ddtree", ["drafter=123"]) == {"drafter": "123"}  # a path, not a number
    got = parse_params("synthetic_chain", ["p=1", "k=4", "commit=replay"])
    assert got == {"p": 1, "k": 4, "commit": "replay"}
    assert build_route({"kind": "synthetic_chain", **got}, V, "greedy", 0.0, 0).params["p"] == 1.0
    chain = {"kind": "synthetic_chain", **parse_params("synthetic_chain", ["k=2.7", "p=0.8"])}
    with pytest.raises(ConfigError, match="k must be an integer >= 1, got 2.7"):
        build_route(chain, V, "greedy", 0.0, 0)
    assert parse_params("ddtree", [], {"drafter": "random", "weaver": None}) == {"drafter": "random"}
    for kind, items, checkpoints, needle in [
        (
            "synthetic_chain",
            ["q=1"],
            None,
            "route kind synthetic_chain: unknown parameter q; synthetic_chain takes p, k",
        ),
        ("synthetic_chain", ["k"], None, "must look like KEY=VALUE"),
        ("synthetic_chain", ["k=1", "k=2"], None, "route parameter k given twice"),
        ("ddtree", ["drafter=a"], {"drafter": "b"}, "route parameter drafter given twice"),
        ("synthetic_chain", [], {"drafter": "random"}, "unknown parameter drafter"),
        ("warp", [], None, "unknown route kind 'warp'"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            parse_params(kind, items, checkpoints)


def generate_kw(**kw):
    base = dict(
        prompt=None, prompt_ids="1,2,3", route="ddtree", params=["budget=4"], target="tiny-random", raw=False,
        max_new_tokens=6, temperature=0.0, seed=0, dtype="float64", device="cpu", commit="closed_form",
        ignore_eos=True,
    )  # fmt: skip
    return {**base, **kw}


def test_drafter_option_equals_drafter_param():
    by_option = generate_one(**generate_kw(checkpoints={"drafter": "random", "weaver": None}))
    by_param = generate_one(**generate_kw(params=["budget=4", "drafter=random"]))
    assert by_option["params"] == by_param["params"] and by_option["params"]["drafter"] == "random"
    assert by_option["output_ids"] == by_param["output_ids"] and by_option["identical_to_ar"] is True


def test_generate_on_a_family_target_uses_its_own_drafter():
    out = generate_one(**generate_kw(target="default", params=["budget=4"], max_new_tokens=4))
    assert out["params"]["drafter"] == "tiny-qwen35-dflash" and out["identical_to_ar"] is True


def test_docs_cli_and_help_agree_with_the_registry():
    """docs/routes.md, `repro routes` and `repro generate --help` are generated from ROUTE_KINDS:
    regenerate docs/routes.md with routes_markdown() when this fails."""
    from repro.cli import app

    assert (ROOT / "docs" / "routes.md").read_text() == routes_markdown()
    cli = CliRunner()
    listed = cli.invoke(app, ["routes"])
    assert listed.exit_code == 0 and listed.output == routes_text() + "\n"
    for kind in ROUTE_KINDS.values():
        assert f"## `{kind.name}`" in routes_markdown() and f"{kind.name}: {kind.help}" in routes_text()
        for p in kind.params:
            assert (
                f"| `{p.name}` | {p.type.__name__} | {p.default_text()} | {p.allowed()} |"
                in routes_markdown()
            )
    shown = cli.invoke(app, ["generate", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert shown.exit_code == 0
    text = " ".join(shown.output.split())
    assert route_help() in text and all(kind in text for kind in ROUTE_KINDS)
    checkpoint_params = {p.name for k in ROUTE_KINDS.values() for p in k.params if p.checkpoint}
    assert checkpoint_params == {"drafter", "weaver"}
    assert all(f"--{name}" in text for name in checkpoint_params)  # each has its own option


# --------------------------------------------------------------------------- no commit leaks


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Per route name: the strategies every GDN-layer commit ran with while that route decoded."""
    seen: dict[str, set[str]] = {}
    current = [""]
    real_commit, real_generate = GatedDeltaNet.commit, engine.generate

    def commit(self, state, ver, path, strategy):  # noqa: ANN001, ANN202
        seen.setdefault(current[0], set()).add(strategy)
        return real_commit(self, state, ver, path, strategy)

    def generate(model, prompt_ids, route, *args, **kwargs):  # noqa: ANN001, ANN202
        current[0] = route.name
        return real_generate(model, prompt_ids, route, *args, **kwargs)

    monkeypatch.setattr(GatedDeltaNet, "commit", commit)
    for module in (runner, evaluation):
        monkeypatch.setattr(module, "generate", generate)
    return seen


LEAK_ROUTES = [
    {"name": "first-replay", "kind": "synthetic_chain", "p": 0.5, "k": 2, "commit": "replay"},
    {"name": "then-default", "kind": "synthetic_chain", "p": 0.5, "k": 2},
]


def test_a_routes_commit_does_not_leak_into_the_next_in_the_runner(commits):
    cfg = resolve(
        {"name": "t", "target": "tiny-random", "dtype": "float64", "suites": ["gsm8k"], "limit": 1,
         "max_new_tokens": 5,
         "commit": "snapshot", "ignore_eos": True, "routes": LEAK_ROUTES},
        {},
    )  # fmt: skip
    run = runner.ExperimentRunner(cfg)
    expected = {"ar": {"snapshot"}, "first-replay": {"replay"}, "then-default": {"snapshot"}}
    run.warm_up()
    assert commits == expected
    commits.clear()
    ids = run.tokenizer.chat_prompt([{"role": "user", "content": "hi"}])
    ref = run.decode(run.routes[0], ids, None).output_ids
    for route in run.routes[1:]:
        assert run.decode(route, ids, ref).output_ids == ref
    assert commits == expected
    assert [r.params["commit"] for r in run.routes] == ["snapshot", "replay", "snapshot"]


def test_a_routes_commit_does_not_leak_into_the_next_in_route_acceptance(model64, commits):
    specs = {  # route_acceptance gives drafters no AR reference: a (random) DFlash drafter
        "first-replay": {"kind": "dflash_chain", "drafter": "random", "block_size": 4, "commit": "replay"},
        "then-default": {"kind": "dflash_chain", "drafter": "random", "block_size": 4},
    }
    prompts = [[5, 6, 7, 8]]
    out = evaluation.route_acceptance(model64, specs, prompts, 6, 0, 4)
    assert all(r["lossless"] for r in out.values())
    assert commits == {"ar": {"closed_form"}, "first-replay": {"replay"}, "then-default": {"closed_form"}}
    commits.clear()
    evaluation.route_acceptance(model64, specs, prompts, 6, 0, 4, commit="snapshot")
    assert commits == {"ar": {"snapshot"}, "first-replay": {"replay"}, "then-default": {"snapshot"}}
