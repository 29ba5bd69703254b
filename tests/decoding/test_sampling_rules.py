"""The sampling acceptance rules in the engine: greedy limit, route parameters, reproducibility."""

from __future__ import annotations

import pytest
import torch

from repro.decoding.acceptance import ACCEPTANCE_RULES, SpecSampling, TargetMatch, Traversal, make_rule
from repro.decoding.engine import generate
from repro.decoding.routes import build_route
from repro.decoding.tree_builders import BestFirst, Chain
from repro.drafters.base import Proposal
from repro.errors import ConfigError, TreeError
from repro.tree import Tree

torch.set_num_threads(1)
PROMPT = list(range(40, 72))
V64 = 260  # the default target's vocabulary


def random_tree(gen: torch.Generator, n: int, vocab: int) -> Tree:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return Tree(torch.randint(0, vocab, (n,), generator=gen), parents)


@pytest.mark.parametrize("rule_cls", [SpecSampling, Traversal])
def test_at_temperature_zero_the_sampling_rules_are_greedy_longest_match(rule_cls):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        tree = random_tree(gen, int(torch.randint(1, 12, (1,), generator=gen)), 4)
        logits = torch.randn(tree.size, 4, generator=gen, dtype=torch.float64)
        want = TargetMatch(0.0, 0).accept(tree, logits, 5)
        got = rule_cls(0.0, trial).accept(tree, logits, 5)
        assert (got.path, got.bonus) == (want.path, want.bonus)


def test_sampled_trees_at_temperature_zero_are_greedy_too():
    """Children drawn from the marginals, judged with their q: at T=0 still the argmax path."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(100):
        probs = torch.softmax(torch.randn(3, 6, generator=gen, dtype=torch.float64), -1)
        rng = __import__("numpy").random.default_rng(trial)
        tree = BestFirst(5, sample=True).build(0, Proposal([[0]] * 3, probs), rng)
        assert tree.draw == "without_replacement" and tree.proposals is not None
        logits = torch.randn(tree.size, 6, generator=gen, dtype=torch.float64)
        want = TargetMatch(0.0, 0).accept(tree, logits, 2)
        for rule in (SpecSampling(0.0, trial), Traversal(0.0, trial)):
            got = rule.accept(tree, logits, 2)
            assert (got.path, got.bonus) == (want.path, want.bonus)


def test_trees_refuse_unknown_draws_and_sampled_draws_without_proposals():
    with pytest.raises(TreeError, match="draw 'random'"):
        Tree([1, 2], [-1, 0], draw="random")
    with pytest.raises(TreeError, match="needs the proposal"):
        Tree([1, 2], [-1, 0], draw="iid")
    with pytest.raises(TreeError, match="proposals has 1 entries"):
        Tree([1, 2], [-1, 0], (None,))


def test_builders_record_proposals_and_sample_from_them():
    probs = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(2)), -1)
    prop = Proposal(probs.topk(2).indices.tolist(), probs)
    top = Chain().build(5, prop)
    assert (
        top.draw == "given"
        and top.proposals is not None
        and top.proposals[0][1].tolist() == probs[0].tolist()
    )
    assert top.proposals[-1] is None
    np = __import__("numpy")
    counts = torch.zeros(8)
    for s in range(4000):
        tree = Chain(sample=True).build(5, prop, np.random.default_rng(s))
        assert tree.draw == "iid" and tree.size == 4
        counts[int(tree.tokens[1])] += 1
    assert (counts / 4000 - probs[0]).abs().max() < 0.03  # depth 1 drawn from its marginal
    with pytest.raises(ValueError, match="random generator"):
        Chain(sample=True).build(5, prop)
    with pytest.raises(ConfigError, match="marginals"):
        Chain(sample=True).build(5, Proposal([[1], [2]]), np.random.default_rng(0))


def test_make_rule_names_every_rule():
    with pytest.raises(ConfigError) as err:
        make_rule("rejection", 1.0, 0)
    assert all(name in str(err.value) for name in ACCEPTANCE_RULES)
    assert isinstance(make_rule("spec_sampling", 1.0, 0), SpecSampling)
    assert isinstance(make_rule("traversal", 0.0, 0), Traversal)


def test_acceptance_is_a_route_parameter_defaulting_to_the_experiments():
    spec = {"name": "c", "kind": "synthetic_chain", "k": 2, "p": 0.5}
    route = build_route(spec, 260, "sample_match", 1.0, 0)
    assert route.params["acceptance"] == "sample_match" and type(route.rule) is TargetMatch
    route = build_route({**spec, "acceptance": "traversal"}, 260, "sample_match", 1.0, 0)
    assert route.params["acceptance"] == "traversal" and isinstance(route.rule, Traversal)
    with pytest.raises(ConfigError, match="route 'c'.*needs temperature 0") as err:
        build_route({**spec, "acceptance": "greedy"}, 260, "sample_match", 1.0, 0)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="acceptance must be one of greedy, sample_match, spec_sampling"):
        build_route({**spec, "acceptance": "rrs"}, 260, "greedy", 0.0, 0)


def test_draft_sample_is_a_dflash_route_parameter(model64):
    spec = {"name": "d", "kind": "ddtree", "drafter": "random", "budget": 8, "block_size": 4}
    assert build_route(spec, 0, "greedy", 0.0, 0, model64).params["draft"] == "top"
    route = build_route({**spec, "draft": "sample"}, 0, "spec_sampling", 1.0, 0, model64)
    assert route.builder.sample and route.random
    with pytest.raises(ConfigError, match="draft must be one of top, sample"):
        build_route({**spec, "draft": "any"}, 0, "greedy", 0.0, 0, model64)
    with pytest.raises(ConfigError, match="unknown parameter"):
        build_route(
            {"kind": "eagle_chain", "drafter": "random", "k": 2, "draft": "sample"},
            0,
            "greedy",
            0,
            0,
            model64,
        )


SPECS = [
    {"name": "tree", "kind": "synthetic_tree", "k": 3, "p": 0.6, "width": 2},
    {
        "name": "ddtree",
        "kind": "ddtree",
        "drafter": "random",
        "budget": 8,
        "block_size": 4,
        "draft": "sample",
    },
    {"name": "chain", "kind": "dflash_chain", "drafter": "random", "block_size": 4, "draft": "sample"},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
@pytest.mark.parametrize("rule", ["spec_sampling", "traversal"])
def test_sampling_rules_decode_reproducibly_and_greedily_at_zero(model64, spec, rule):
    ar0 = generate(model64, PROMPT, build_route({"kind": "ar"}, 0, "greedy", 0.0, 3), 24).output_ids
    at0 = build_route({**spec, "acceptance": rule}, V64, "greedy", 0.0, 3, model64)
    assert generate(model64, PROMPT, at0, 24, reference_ids=ar0).output_ids == ar0
    ar1 = generate(model64, PROMPT, build_route({"kind": "ar"}, 0, "sample_match", 1.0, 3), 24).output_ids
    runs = []
    for _ in range(2):
        route = build_route({**spec, "acceptance": rule}, V64, "sample_match", 1.0, 3, model64)
        res = generate(model64, PROMPT, route, 24, reference_ids=ar1)
        assert len(res.output_ids) == 24 and sum(res.accepted_lengths) == 23
        runs.append(res.output_ids)
    assert runs[0] == runs[1]  # seeded: the same seed decodes the same tokens
    assert runs[0][0] == ar1[0]  # the first token is prefill's, AR's position-keyed pick
